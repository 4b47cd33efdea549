"""Evals as calls: suites found or registered, scored on a checkpoint, their results read and compared.

Contract:
- A suite is named `NAME` (its newest registered version), `NAME@VERSION`, a YAML or Python file, or a shipped
  suite (`smoke`); files and shipped suites are registered on first use, once every environment of theirs
  loads here and gives the suite's tasks. A name the ledger does not hold is `NotFound`; a file that does not
  parse, an environment that does not load, or other content under a registered version is a `ControlError`.
- `run_eval` starts (or joins) the `EvalWorkflow` scoring a suite on a checkpoint and returns its outcome,
  reporting the episodes played as it goes; a suite version already scored on that checkpoint is not played
  again. Scores live in the ledger (one `EvalResult` per suite version, checkpoint and environment).
- `compare` reads two checkpoints' scores of one suite version; `Comparison.dropped` names the environments
  whose score fell by more than `max_drop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollout.config.defaults import EVAL_EPISODES_IN_FLIGHT
from rollout.control.connections import connect_temporal, ledger_session, stack_action
from rollout.control.errors import ControlError, NotFound
from rollout.control.waits import patiently, workflow_result

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.evals import EvalResult, Suite
    from rollout.evals.scoring import Change
    from rollout.ledger import Ledger
    from rollout.stack.embedded import Stack
    from rollout.workflows.eval_types import EvalInput, EvalOutcome


def eval_input(
    suite: Suite,
    checkpoint: str,
    *,
    max_tokens: int | None = None,
    bridge_formats: list[str] | None = None,
    in_flight: int = EVAL_EPISODES_IN_FLIGHT,
    served_wait_s: float = 600.0,
) -> EvalInput:
    """The `EvalWorkflow` input that scores `suite` on `checkpoint` (a reference, resolved when it runs);
    `max_tokens` caps the turns of environments whose suite sets none (`run.max_tokens`); a checkpoint with no
    serving target is bridged to `bridge_formats` (default: lora); at most `in_flight` of its episodes play at
    once (`eval.episodes_in_flight`)."""
    from rollout.workflows.eval_types import EvalInput, EvalTarget

    targets = [
        EvalTarget(
            name=e.name,
            reference=e.environment,
            episodes=e.episodes,
            tasks=e.tasks,
            first=e.first,
            temperature=float(e.temperature),
            max_tokens=e.max_tokens,
            metric=e.metric,
            threshold=float(e.threshold),
        )
        for e in suite.environments
    ]
    return EvalInput(
        suite=suite.name,
        version=suite.version,
        suite_hash=suite.content_hash(),
        environments=targets,
        checkpoint=checkpoint,
        served_wait_s=served_wait_s,
        episodes_in_flight=in_flight,
        default_max_tokens=max_tokens,
        bridge_formats=bridge_formats or ["lora"],
    )


async def suite_named(ledger: Ledger, source: str) -> Suite:
    """The suite `source` names, registering a file's or a shipped suite on first use."""
    from rollout.evals import SuiteError, SuiteVersionTaken, UnknownSuite, load_suite
    from rollout.evals.records import find_suite, register
    from rollout.evals.suites import SHIPPED

    name, _, version = source.partition("@")
    if not (source.endswith((".yaml", ".yml", ".py")) or ":" in source):
        if (SHIPPED / f"{name}.yaml").is_file():
            # The shipped version is registered before the name is looked up, so a release that ships a new
            # version makes it the newest; a version the ledger holds with other content keeps that content.
            with contextlib.suppress(SuiteVersionTaken):
                await register(ledger, checked_suite(load_suite(name)))
        try:
            return await find_suite(ledger, name, version or None)
        except UnknownSuite as error:
            raise NotFound(str(error)) from None
    try:
        suite = checked_suite(load_suite(source))
    except SuiteError as error:
        raise ControlError(str(error)) from None
    try:
        await register(ledger, suite)
    except SuiteVersionTaken as error:
        raise ControlError(str(error)) from None
    return suite


def checked_suite(suite: Suite) -> Suite:
    """`suite`, once every environment of it loads here and can give the suite's tasks (nothing is
    recorded)."""
    from rollout.environment import EnvironmentLoadError, load_environment

    for entry in suite.environments:
        try:
            environment = load_environment(entry.environment)
            environment.task_source(entry.tasks)
        except (EnvironmentLoadError, ValueError) as error:
            raise ControlError(f"suite {suite.ref}, environment {entry.name!r}: {error}") from None
    return suite


async def register_suite(settings: Settings, file: str) -> tuple[Suite, bool]:
    """Record the suite of `file` under NAME@VERSION; whether it was new (the same content again is not)."""
    from rollout.evals import SuiteError, SuiteVersionTaken, load_suite
    from rollout.evals.records import register

    try:
        suite = checked_suite(load_suite(file))
    except SuiteError as error:
        raise ControlError(str(error)) from None
    async with ledger_session(settings) as ledger:
        try:
            return suite, await register(ledger, suite)
        except SuiteVersionTaken as error:
            raise ControlError(str(error)) from None


async def run_eval(
    settings: Settings,
    stack: Stack | None,
    source: str,
    checkpoint: str,
    report: Callable[[str], None] = lambda line: None,
) -> tuple[Suite, EvalOutcome]:
    """Score suite `source` on `checkpoint` and wait for the scores. With `stack`, an embedded stack whose
    trainer is started first when the checkpoint needs bridging before an engine can load it."""
    from temporalio.client import WorkflowFailureError
    from temporalio.common import WorkflowIDConflictPolicy

    from rollout.evals.checkpoints import UnknownCheckpoint, resolve
    from rollout.workflows.client import failure_reason
    from rollout.workflows.evals import EvalWorkflow
    from rollout.workflows.names import RUNNER_QUEUE, eval_workflow_id

    async with ledger_session(settings) as ledger:
        suite = await suite_named(ledger, source)
        try:
            chosen = await resolve(ledger, checkpoint)
        except UnknownCheckpoint as error:
            raise NotFound(str(error)) from None
        if chosen.needs_serving and not chosen.formats and stack is not None:
            # No engine can load it yet (an SFT adapter): the trainer worker bridges it first (a cluster's
            # trainer runs already).
            report("trainer: starting (to make the checkpoint servable)")
            await asyncio.to_thread(stack_action, lambda: stack.start_trainer(restart=False))
        client = await connect_temporal(settings, patience_s=30)
        given = eval_input(
            suite,
            checkpoint,
            max_tokens=settings.run.max_tokens,
            bridge_formats=["lora"] if settings.trainer.lora_rank else ["merged"],
            in_flight=settings.eval.episodes_in_flight,
        )
        then = f"The eval goes on: `rollout eval run {source} --checkpoint {checkpoint}` again waits for it."
        handle = await patiently(
            lambda: client.start_workflow(
                EvalWorkflow.run,
                given,
                id=eval_workflow_id(suite.name, suite.version, checkpoint),
                task_queue=RUNNER_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,  # one under way: wait for it
            ),
            "the eval to start",
            settings,
            then=then,
        )
        trouble = [""]  # what the wait is held up by, shown on the progress line until Temporal answers
        waiting = asyncio.ensure_future(
            workflow_result(
                handle,
                "the eval's result",
                settings,
                report=lambda line: trouble.__setitem__(0, line),
                then=then,
            )
        )
        try:
            started = time.monotonic()
            while not waiting.done():
                done = await _episodes_done(ledger, suite, checkpoint)
                line = f"{suite.ref} on {checkpoint}: {done} episodes played ({time.monotonic() - started:.0f} s)"
                report(f"{line} · {trouble[0]}" if trouble[0] else line)
                await asyncio.wait([waiting], timeout=1.0)
            return suite, waiting.result()
        except WorkflowFailureError as error:
            raise ControlError(
                f"the eval of {suite.ref} on {checkpoint} failed: {failure_reason(error)}"
            ) from None
        finally:
            waiting.cancel()


async def _episodes_done(ledger: Ledger, suite: Suite, checkpoint: str) -> int:
    from rollout.evals.checkpoints import resolve
    from rollout.ledger import Kind
    from rollout.ledger.queries import count_events
    from rollout.ledger.streams import run_episodes_stream
    from rollout.workflows.names import eval_run

    name = (await resolve(ledger, checkpoint)).name
    total = 0
    for entry in suite.environments:
        stream = run_episodes_stream(eval_run(suite.name, suite.version, name, entry.name))
        total += await count_events(ledger, stream, Kind.EPISODE_FINISHED)
    return total


async def read_results(
    settings: Settings, suite: str | None = None, run: str | None = None
) -> list[EvalResult]:
    """Recorded scores of `suite` (NAME or NAME@VERSION; every suite by default), only of `run`'s checkpoints
    when given."""
    from rollout.evals.records import results

    name, _, version = (suite or "").partition("@")
    async with ledger_session(settings) as ledger:
        found = await results(ledger, name or None)
    return [
        r
        for r in found
        if (not version or r.version == version) and (run is None or (r.policy or "").startswith(f"{run}/"))
    ]


@dataclass(frozen=True)
class Comparison:
    """Two checkpoints' scores of one suite version, environment by environment."""

    suite: str  # NAME@VERSION
    baseline: str
    candidate: str
    changes: list[Change]

    @property
    def dropped(self) -> list[str]:
        return [c.environment for c in self.changes if c.regressed]


async def compare(
    settings: Settings, suite: str, baseline: str, candidate: str, max_drop: float
) -> Comparison:
    """Compare `candidate` against `baseline` on `suite` (default version: the newest); both must have been
    scored on that version."""
    from rollout.evals.checkpoints import UnknownCheckpoint, resolve
    from rollout.evals.records import UnknownSuite, find_suite, results
    from rollout.evals.scoring import changes

    name, _, version = suite.partition("@")
    async with ledger_session(settings) as ledger:
        try:
            chosen = await find_suite(ledger, name, version or None)
            a = (await resolve(ledger, baseline)).name
            b = (await resolve(ledger, candidate)).name
        except (UnknownSuite, UnknownCheckpoint) as error:
            raise NotFound(str(error)) from None
        found = await results(ledger, name)
    version = chosen.version
    by_checkpoint: dict[str, dict[str, float]] = {a: {}, b: {}}
    for result in found:
        if result.version == version and result.checkpoint in by_checkpoint:
            by_checkpoint[result.checkpoint][result.environment] = result.score
    environments = sorted(by_checkpoint[a].keys() | by_checkpoint[b].keys())
    missing = [f"{c} × {e}" for c in (a, b) for e in environments if e not in by_checkpoint[c]]
    if not environments or missing:
        raise NotFound(
            f"{name}@{version} has no score for {', '.join(missing) or f'{a} or {b}'}: score both with "
            f"`rollout eval run {name}@{version} --checkpoint CHECKPOINT`"
        )
    return Comparison(f"{name}@{version}", a, b, changes(by_checkpoint[a], by_checkpoint[b], max_drop))


async def run_eval_scores(settings: Settings, run: str) -> list[dict[str, object]]:
    """The eval scores of `run`'s checkpoints (`eval.every`), one entry per checkpoint in step order."""
    by_checkpoint: dict[str, dict[str, object]] = {}
    for r in sorted(await read_results(settings, run=run), key=lambda r: r.checkpoint_version):
        entry = by_checkpoint.setdefault(
            r.checkpoint, {"suite": f"{r.suite}@{r.version}", "checkpoint": r.checkpoint, "scores": {}}
        )
        scores = entry["scores"]
        assert isinstance(scores, dict)
        scores[r.environment] = r.score
    return list(by_checkpoint.values())
