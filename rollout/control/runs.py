"""Runs as calls: start one, list them, read where one is, change it while it plays, reattach to it.

Contract:
- Numbers come from the ledger (what is durable: episodes, groups, batches, checkpoints); the run's workflow
  adds what only it knows (paused, stopped, max_lag, whether it still plays). A row is a JSON-ready dict (the
  shape `rollout run list --json` prints). One run's row also has each trained policy's curves (`curves`:
  its steps, and per step its mean reward and loss), so its policies read side by side, and each policy's
  newest step record (`newest_step`: rollout.tracking.step_metrics, the numbers a tracker logs), and how its
  tracking backends stand (`tracking`: rollout.control.tracking's state, and `said`, it in a line; None
  without any).
- `start_run` first has a runner confirm it can load the environment (`PreflightFailed` otherwise: nothing
  starts); a `max_lag` below 0 is refused before anything is asked of a service.
- `update_run` is the one run control of every face (the CLI, the dashboard's buttons, the gateway's operator
  routes through `OperatorRuns`): it sends a `RunChange` (pause, resume, stop, max_lag) once, riding out
  Temporal's bad moments for `window_s`, and answers the run's `RunStatus` after it. A change the run refuses
  is `RunRefused`; a run that is not playing is `NotFound`; Temporal not answering is `Unreachable`.
- `OperatorRuns` is the gateway's `RunControl` (its operator routes) on `update_run`: each failure above
  becomes its HTTP status (409, 404, 503).
- `recorded_launch` reads how a training run was launched (its trainer settings, the model it trains, where
  its environment was imported from); `bring_stack_to` brings the embedded stack to it (an engine serving
  another model is restarted on the run's); `reattach` then resumes a run paused by hand (it must be playing).
- `refuse_a_stack_serving_another_model` stops a resume that could never sample: the run trains a model the
  stack's engine does not serve.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rollout.control.connections import connect_temporal, ledger_session
from rollout.control.errors import ControlError, NotFound, Unreachable
from rollout.control.waits import OUTAGE_S, patiently, workflow_result

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout.config import Settings
    from rollout.ledger import Ledger
    from rollout.ledger.queries import RunProgress, RunRow
    from rollout.ledger.views import StepRow
    from rollout.run.launches import RunLaunch
    from rollout.run.settings import RunChange, RunStatus

NO_SUCH_RUN = "the ledger has no run {run!r}: `rollout run list` shows the runs it has"


async def start_run(
    settings: Settings,
    environment: str,
    *,
    run: str | None = None,
    groups: int | None = None,
    in_flight: int | None = None,
    max_lag: int | None = None,
    wait: bool = False,
    report: Callable[[str], None] = lambda line: None,
) -> dict[str, object]:
    """Start a run of `environment` (played by runner workers, training nothing); its status once it ends with
    `wait` (`report` hears what holds the wait up), else its id and workflow id."""
    from rollout.control.preflight import confirm_runner_loads
    from rollout.run.settings import BadRunSetting, RunSettings, max_lag_of
    from rollout.workflows.client import start_run as start_workflow
    from rollout.workflows.run_types import RunInput

    try:
        lag = settings.run.max_lag if max_lag is None else max_lag_of(max_lag, "--max-lag")
    except BadRunSetting as error:
        raise ControlError(str(error), usage=True) from None
    run_id = run or f"run-{uuid.uuid4().hex[:8]}"
    given = RunInput(
        run=run_id,
        environment=environment,
        groups_in_flight=settings.run.groups_in_flight if in_flight is None else in_flight,
        max_groups=groups,
        max_failure_rate=settings.run.max_failure_rate,
        failure_window=settings.run.failure_window,
        settings=RunSettings(max_lag=lag, max_tokens=settings.run.max_tokens),
    )
    client = await connect_temporal(settings)
    await patiently(
        lambda: confirm_runner_loads(client, run_id, environment),
        f"a runner to check {environment}",
        settings,
    )
    handle = await start_workflow(client, given)
    if not wait:
        return {"run": run_id, "workflow": handle.id}
    status = await workflow_result(
        handle,
        f"run {run_id} to end",
        settings,
        report=report,
        then=f"The run goes on: `rollout run status {run_id}` shows it.",
    )
    return asdict(status)


def state_word(state: str, status: RunStatus | None) -> str:
    """A run's state in a word or two, from its workflow's state and (while it runs) its status."""
    if status is not None:
        if status.pause_reason:
            return "paused (" + status.pause_reason + ")"
        return "paused" if status.paused else "stopping" if status.stopped else "playing"
    words = {
        "COMPLETED": "finished",
        "MISSING": "gone",
        "NO_WORKER": "waiting for a worker (`rollout up`)",
        "UNANSWERED": "running (its worker did not answer in time)",
    }
    return words.get(state, state.lower())


def _row(run: RunRow, progress: RunProgress, state: str, status: RunStatus | None) -> dict[str, Any]:
    return {
        "run": run.run,
        "environment": run.environment,
        "created_at": run.created_at.isoformat(timespec="seconds"),
        "state": state_word(state, status),
        "max_lag": status.max_lag if status is not None else run.settings.max_lag,
        "episodes_finished": progress.episodes_finished,
        "episodes_failed": progress.episodes_failed,
        "groups_recorded": progress.groups_recorded,
        "steps": sum(p.checkpoints for p in progress.policies.values()),
        "batches_skipped": sum(p.batches_skipped for p in progress.policies.values()),
        "groups_replaced": sum(p.groups_replaced for p in progress.policies.values()),
        "policies": {name: asdict(p) for name, p in progress.policies.items()},
    }


async def run_rows(settings: Settings, only: str | None = None) -> list[dict[str, Any]]:
    """Every run the ledger holds, newest first (or only run `only`), with its state and progress; run `only`
    also with why its episodes failed (`failures`: kind, place in the environment's code, count, the first
    reason and episode)."""
    from rollout.control.tracking import tracking_line, tracking_state
    from rollout.ledger.queries import failure_counts, find_run, list_runs, run_progress
    from rollout.ledger.views import run_steps
    from rollout.workflows.client import run_state

    client = await connect_temporal(settings)
    async with ledger_session(settings) as ledger:
        if only is None:
            runs = await list_runs(ledger)
        else:
            found = await find_run(ledger, only)
            if found is None:
                raise NotFound(NO_SUCH_RUN.format(run=only))
            runs = [found]
        rows = []
        for run in runs:
            state, status = await run_state(client, run.run)
            row = _row(run, await run_progress(ledger, run.run), state, status)
            if only is not None:
                row["failures"] = [
                    asdict(f) | {"summary": f.summary} for f in await failure_counts(ledger, run.run)
                ]
                row["curves"] = policy_curves(run.run, await run_steps(ledger, run.run))
                row["newest_step"] = await newest_steps(ledger, run.run, row["policies"])
                tracking = await tracking_state(client, run.run)
                row["tracking"] = (
                    asdict(tracking) | {"said": tracking_line(tracking)} if tracking is not None else None
                )
            rows.append(row)
        return rows


async def newest_steps(ledger: Ledger, run: str, policies: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each policy's newest step record (rollout.tracking.step_metrics), by its name in the environment."""
    from rollout.tracking.step_metrics import newest_step_metrics

    newest: dict[str, dict[str, Any]] = {}
    for ledger_policy in policies:
        name = ledger_policy.removeprefix(f"{run}/")
        if (record := await newest_step_metrics(ledger, run, name)) is not None:
            newest[name] = record.to_json()
    return newest


CURVES = {"reward": "reward_mean", "loss": "loss"}  # what `run status` draws per policy, by metric


def policy_curves(run: str, steps: list[StepRow]) -> dict[str, dict[str, list[float | None]]]:
    """Each trained policy's curves, by its name in the environment: `step` (each checkpoint's version) and,
    per step, each of `CURVES` (None where the step did not record it)."""
    curves: dict[str, dict[str, list[float | None]]] = {}
    for step in steps:
        policy = curves.setdefault(
            step.policy.removeprefix(f"{run}/"), {"step": [], **{k: [] for k in CURVES}}
        )
        policy["step"].append(step.version)
        for label, key in CURVES.items():
            policy[label].append(step.metrics.get(key))
    return curves


class RunRefused(ControlError):
    """The run's workflow refused the change (its check of the value)."""


async def update_run(
    settings: Settings,
    run: str,
    change: RunChange,
    *,
    report: Callable[[str], None] = lambda line: None,
    window_s: float = OUTAGE_S,
    client: Client | None = None,
) -> RunStatus:
    """Make `change` to run `run` through its workflow (once, however often Temporal's bad moments within
    `window_s` make it try again); its status after the change."""
    from rollout.workflows.client import RunNotPlaying, RunUpdateRefused
    from rollout.workflows.client import update_run as send_update

    client = client or await connect_temporal(settings, patience_s=min(30.0, window_s))
    update_id = f"{change.label}-{uuid.uuid4().hex}"  # a retried update with this id is applied once
    try:
        return await patiently(
            lambda: send_update(client, run, change, update_id=update_id),
            f"run {run} to take {change.label}",
            settings,
            report=report,
            then=f"`rollout run status {run}` shows whether it took it; sending it again is harmless.",
            window_s=window_s,
        )
    except RunUpdateRefused as error:
        raise RunRefused(f"run {run} refused {change.label}: {error}") from None
    except RunNotPlaying as error:
        raise NotFound(
            f"{error}: `rollout run list` shows the runs, `rollout run start` starts one"
        ) from None


class OperatorRuns:
    """The gateway's run control (`rollout.gateway.operator.RunControl`): `update_run`, each failure as the
    HTTP status the operator routes answer. Temporal is connected on first use, so a gateway starts (and
    serves turns) without it."""

    WINDOW_S = 30.0  # how long one route rides out Temporal's bad moments before it answers 503
    # An update waits for a runner to take it: without one, the route answers 503 after this long.
    UPDATE_TIMEOUT_S = 60.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    async def _change(self, run: str, change: RunChange) -> dict[str, Any]:
        from rollout.gateway.operator import RunControlError

        try:
            async with self._lock:
                if self._client is None:
                    self._client = await connect_temporal(self.settings)
            async with asyncio.timeout(self.UPDATE_TIMEOUT_S):
                status = await update_run(
                    self.settings, run, change, window_s=self.WINDOW_S, client=self._client
                )
        except TimeoutError as error:
            raise RunControlError(
                503,
                f"run {run} did not take {change.label} within {self.UPDATE_TIMEOUT_S:.0f}s: is a runner up?",
            ) from error
        except RunRefused as error:
            raise RunControlError(409, str(error)) from error
        except NotFound as error:
            raise RunControlError(404, str(error)) from error
        except Unreachable as error:
            raise RunControlError(503, str(error)) from error
        except ControlError as error:  # a Temporal TLS file it cannot read
            raise RunControlError(503, str(error)) from error
        return asdict(status)

    async def pause(self, run: str) -> dict[str, Any]:
        from rollout.run.settings import PauseRun

        return await self._change(run, PauseRun())

    async def resume(self, run: str) -> dict[str, Any]:
        from rollout.run.settings import ResumeRun

        return await self._change(run, ResumeRun())

    async def set_max_lag(self, run: str, max_lag: int) -> dict[str, Any]:
        from rollout.run.settings import MaxLagChange

        return await self._change(run, MaxLagChange(max_lag))


async def recorded_launch(settings: Settings, run: str) -> RunLaunch:
    """How training run `run` was launched, as it recorded it (`NotFound` for no such run; a `ControlError`
    for a run that trains nothing, or whose record does not pass its checks)."""
    from rollout.ledger.queries import find_run
    from rollout.ledger.streams import run_stream
    from rollout.run.launches import LAUNCHED, RunLaunch

    async with ledger_session(settings) as ledger:
        found = await find_run(ledger, run)
        launched = await ledger.find(run_stream(run), LAUNCHED) if found else None
    if found is None:
        raise NotFound(NO_SUCH_RUN.format(run=run))
    if launched is None:
        raise ControlError(
            f"run {run} trains nothing (it was started by `rollout run start`): follow it with "
            f"`rollout run status {run} --watch`"
        )
    try:
        return RunLaunch.from_payload(launched.payload)
    except ValueError as error:
        raise ControlError(
            f"run {run}'s launch record is not one rollout wrote, so it is not used: {error}"
        ) from None


def bring_stack_to(settings: Settings, launch: RunLaunch, report: Callable[[str], None]) -> None:
    """Start what is missing of the embedded stack of `settings` (which carry `launch.overrides`) for the run:
    an engine and gateway serving another model are restarted on the run's, its trainer with the run's
    settings, the sandboxes its episodes claim."""
    import sys

    from rollout.control.training import check_training, ready_stack
    from rollout.stack.embedded import Stack

    # The environment is loaded from where the run loaded it (this command may run from elsewhere).
    sys.path[:0] = [p for p in launch.import_path if p not in sys.path]
    environment = check_training(settings, launch.environment)
    ready_stack(Stack(settings, import_path=launch.import_path), settings, environment, report)


async def refuse_a_stack_serving_another_model(settings: Settings, run: str) -> None:
    """Raise, naming `rollout run attach`, when `run` trains a model the stack's engine does not serve (no
    turn of it could be admitted); a run that trains nothing, or an engine that does not answer, passes."""
    from rollout.control.training import serves_another_model

    try:
        launch = await recorded_launch(settings, run)
    except ControlError:
        return
    served = await asyncio.to_thread(serves_another_model, settings, launch.model)
    if served is not None:
        raise ControlError(
            f"run {run} trains {launch.model}, but the stack's engine serves {served}: no turn of the run could "
            f"sample. `rollout run attach {run}` brings the stack to the run's model and settings, resumes the "
            "run and follows it."
        )


async def reattach(settings: Settings, run: str) -> list[str]:
    """Ready playing run `run` to be followed again: resume it if it was paused by hand. The policies it
    trains."""
    from rollout.workflows.client import run_state

    state, status = await run_state(await connect_temporal(settings, patience_s=30), run)
    if state == "UNANSWERED":
        raise ControlError(
            f"run {run}'s workflow did not answer in time (its worker is busy or stuck): try "
            f"`rollout run attach {run}` again"
        )
    if state != "RUNNING" or status is None:
        raise ControlError(
            f"run {run} is not playing (its workflow is {state_word(state, None)}): `rollout run status {run}` "
            "shows where it ended"
        )
    if status.paused and not status.pause_reason:
        from rollout.run.settings import ResumeRun

        await update_run(settings, run, ResumeRun())
    return list(status.trained) or ["default"]
