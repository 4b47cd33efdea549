"""Workflows call activities through typed stubs, and workflows and messages by reference, never by a string.

Each activity stub (rollout.workflows.runner_stubs, rollout.workflows.trainer_stubs) has exactly one
implementation among the activities its worker registers, under the stub's name and with the stub's parameter
and return types; every registered activity has a stub; every stub is called by some workflow; and no workflow
or worker module names an activity, workflow, signal, query or update with a string literal.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import typing
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from temporalio import activity, workflow

from rollout.activities.bridges import BridgeActivities
from rollout.activities.evals import EvalActivities
from rollout.activities.local_training import LocalProvider
from rollout.activities.runner import RunnerActivities
from rollout.activities.tinker_training import TinkerProvider, TinkerTrainerConfig
from rollout.activities.tracking import TrackingActivities
from rollout.activities.training import TrainingActivities, TrainingProvider
from rollout.rl.losses import LossConfig
from rollout.training.local import LocalTrainerConfig
from rollout.workers.trainer import trainer_worker_activities
from rollout.workflows import runner_stubs, signals, trainer_stubs
from rollout.workflows.run import RunWorkflow
from rollout.workflows.training import TrainingWorkflow

ROOT = Path(__file__).resolve().parent.parent
SCANNED = sorted([*ROOT.glob("rollout/workflows/*.py"), *ROOT.glob("rollout/workers/*.py")])
# Calls whose first argument names an activity, a workflow or a message: a string there is a name spelled by
# hand.
BY_NAME = {
    "execute_activity",
    "start_activity",
    "execute_local_activity",
    "start_local_activity",
    "execute_child_workflow",
    "start_child_workflow",
    "start_workflow",
    "execute_workflow",
    "signal",
    "query",
    "execute_update",
    "start_update",
}
NO_LEDGER: Any = None  # the activities are only looked at here, never run


def _definition(fn: Callable[..., Any]) -> Any:
    # temporalio keeps an activity's name on the function; it has no public reader for it.
    return activity._Definition.must_from_callable(fn)


def stubs(module: ModuleType) -> dict[str, Callable[..., Any]]:
    found = {
        _definition(fn).name: fn
        for fn in vars(module).values()
        if inspect.isfunction(fn)
        and fn.__module__ == module.__name__
        and activity._Definition.from_callable(fn) is not None
    }
    assert found, f"{module.__name__} defines no activity stubs"
    return found


def types_of(fn: Callable[..., Any]) -> tuple[list[Any], Any]:
    signature = inspect.signature(fn, eval_str=True)  # a bound method: without self
    return [p.annotation for p in signature.parameters.values()], signature.return_annotation


def runner_registered() -> list[Callable[..., Any]]:
    runner = RunnerActivities(
        NO_LEDGER, gateway_url="http://runner.invalid", seat_secret=b"s" * 32, sandbox_key=b"k" * 32
    )
    return [
        *runner.all(),
        *EvalActivities(NO_LEDGER).all(),
        *TrackingActivities(NO_LEDGER, Path("unused")).all(),
    ]


def trainer_registered(provider: str, scratch: Path) -> list[Callable[..., Any]]:
    chosen: TrainingProvider
    if provider == "local":
        chosen = LocalProvider(
            NO_LEDGER,
            NO_LEDGER,
            model_path="unused",
            config=LocalTrainerConfig(),
            loss=LossConfig(),
            holder="test",
            scratch=scratch,
        )
    else:
        chosen = TinkerProvider(
            NO_LEDGER,
            NO_LEDGER,
            config=TinkerTrainerConfig(base_model="unused"),
            loss=LossConfig(),
            scratch=scratch,
        )
    training = TrainingActivities(NO_LEDGER, NO_LEDGER, chosen, holder="test")
    bridges = BridgeActivities(NO_LEDGER, NO_LEDGER, base_model=None, scratch=scratch)
    return list(trainer_worker_activities(training, bridges))


def check_worker(module: ModuleType, registered: list[Callable[..., Any]]) -> None:
    wanted = stubs(module)
    by_name = Counter(_definition(fn).name for fn in registered)
    assert {name for name, n in by_name.items() if n > 1} == set(), "an activity registered twice"
    assert set(by_name) == set(wanted), (
        f"registered without a stub: {sorted(set(by_name) - set(wanted))}; "
        f"stubs without an implementation: {sorted(set(wanted) - set(by_name))}"
    )
    for fn in registered:
        name = _definition(fn).name
        assert types_of(fn) == types_of(wanted[name]), (
            f"{name}: the implementation's types differ from the stub's"
        )


@pytest.mark.parametrize("module", [runner_stubs, trainer_stubs])
def test_each_stub_is_named_by_its_function_and_never_runs(module: ModuleType) -> None:
    for name, stub in stubs(module).items():
        assert name == stub.__name__, f"{module.__name__}.{stub.__name__} is registered as {name!r}"
        assert inspect.iscoroutinefunction(stub) and stub.__doc__, f"{name}: an async stub with its contract"
        body = ast.parse(inspect.getsource(stub)).body[0]
        assert isinstance(body, ast.AsyncFunctionDef)
        assert isinstance(body.body[-1], ast.Raise), f"{name}: a stub's body only raises NotImplementedError"


def test_the_runner_worker_implements_each_runner_stub_once() -> None:
    check_worker(runner_stubs, runner_registered())


@pytest.mark.parametrize("provider", ["local", "tinker"])
def test_the_trainer_worker_implements_each_trainer_stub_once(provider: str, tmp_path: Path) -> None:
    check_worker(trainer_stubs, trainer_registered(provider, tmp_path))


def _calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.Call)]


def test_no_workflow_or_worker_calls_anything_by_a_string_name() -> None:
    spelled = []
    for path in SCANNED:
        for call in _calls(path):
            if not (isinstance(call.func, ast.Attribute) and call.func.attr in BY_NAME):
                continue
            first = call.args[0] if call.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                spelled.append(f"{path.relative_to(ROOT)}:{call.lineno} {call.func.attr}({first.value!r})")
            # Temporal takes the result type from the stub or the run method: result_type would be ignored.
            if any(k.arg == "result_type" for k in call.keywords):
                spelled.append(
                    f"{path.relative_to(ROOT)}:{call.lineno} {call.func.attr}(..., result_type=...)"
                )
    assert spelled == []


def test_every_stub_is_called_by_a_workflow() -> None:
    called = {
        (node.value.id, node.attr)
        for path in ROOT.glob("rollout/workflows/*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    for module in (runner_stubs, trainer_stubs):
        alias = module.__name__.rsplit(".", 1)[1]
        unused = [name for name in stubs(module) if (alias, name) not in called]
        assert unused == [], f"stubs no workflow calls: {unused}"


def _workflow_classes() -> list[type]:
    found: list[type] = []
    for path in sorted(ROOT.glob("rollout/workflows/*.py")):
        module = importlib.import_module(f"rollout.workflows.{path.stem}")
        found += [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and value.__module__ == module.__name__
            and workflow._Definition.from_class(value) is not None
        ]
    return found


def _inputs(fn: Callable[..., Any]) -> list[Any]:
    hints = typing.get_type_hints(fn)
    return [hints[name] for name in list(inspect.signature(fn).parameters)[1:]]


def test_every_message_takes_at_most_one_record_and_every_query_returns_one() -> None:
    """Temporal's guidance: one dataclass input per signal and update, so a field added later needs no new
    argument; queries answer with a record, never a dict."""
    classes = _workflow_classes()
    assert RunWorkflow in classes and len(classes) >= 6
    loose: list[str] = []
    for cls in classes:
        definition = workflow._Definition.must_from_class(cls)
        handlers = [*definition.signals.values(), *definition.updates.values(), *definition.queries.values()]
        for handler in handlers:
            assert handler.fn is not None
            inputs = _inputs(handler.fn)
            if len(inputs) > 1 or any(not dataclasses.is_dataclass(given) for given in inputs):
                loose.append(f"{cls.__name__}.{handler.fn.__name__} takes {inputs}")
        for query in definition.queries.values():
            assert query.fn is not None
            answer = typing.get_type_hints(query.fn)["return"]
            if not dataclasses.is_dataclass(answer):
                loose.append(f"{cls.__name__}.{query.fn.__name__} answers {answer}")
    assert loose == []


def test_each_signal_stub_is_its_handler_by_name_and_input() -> None:
    """A workflow that cannot import the one it signals calls a stub (rollout.workflows.signals): the stub's
    name and record must be the handler's, or the signal would reach nothing, or fail to decode."""
    for stubs_class, target in (
        (signals.RunSignals, RunWorkflow),
        (signals.TrainingSignals, TrainingWorkflow),
    ):
        handlers = workflow._Definition.must_from_class(target).signals
        for name, stub in inspect.getmembers(stubs_class, inspect.isfunction):
            defined = workflow._SignalDefinition.from_fn(stub)
            assert defined is not None and defined.name in handlers, (name, target)
            handler = handlers[defined.name].fn
            assert handler is not None and _inputs(handler) == _inputs(stub), (name, target)


def test_no_message_is_sent_by_a_name_written_at_its_call_site() -> None:
    """Signals, updates and queries are sent by reference (a handler, or its stub), which carries the name and
    the record: never a string, or a constant holding one."""
    by_name: list[str] = []
    for path in sorted(ROOT.glob("rollout/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            if node.func.attr not in {"signal", "execute_update", "start_update", "query"}:
                continue
            first = node.args[0]
            if (isinstance(first, ast.Constant) and isinstance(first.value, str)) or (
                isinstance(first, ast.Name) and first.id.isupper()
            ):
                by_name.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert by_name == []


def test_no_activity_can_wait_on_a_dead_worker_for_long() -> None:
    """Every activity call heartbeats (`heartbeating(...)` options, or a heartbeat timeout of its own) or is a
    quick ledger write (`QUICK`): so an attempt on a dead worker times out within ~30 s and is retried
    elsewhere (rollout.workflows.options)."""
    unfitted: list[str] = []
    for path in sorted(ROOT.glob("rollout/workflows/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in {"execute_activity", "start_activity"}:
                continue
            fitted = any(
                (keyword.arg == "heartbeat_timeout")
                or (
                    keyword.arg is None
                    and isinstance(keyword.value, ast.Name)
                    and keyword.value.id == "QUICK"
                )
                or (
                    keyword.arg is None
                    and isinstance(keyword.value, ast.Call)
                    and isinstance(keyword.value.func, ast.Name)
                    and keyword.value.func.id == "heartbeating"
                )
                for keyword in node.keywords
            )
            if not fitted:
                unfitted.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unfitted, f"activity calls with neither a heartbeat nor QUICK options: {unfitted}"
