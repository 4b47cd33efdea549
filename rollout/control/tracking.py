"""A training run's tracking as the control layer sees it: what the run's feed is told, and how it stands.

Contract:
- `tracking_input(settings, run, environment)` is the `TrackingInput` a run started with these settings
  carries (None when `tracking.backends` is empty and `tracking.otlp_endpoint` unset): the backends'
  settings, the OTLP endpoint for the run's traces and, as the backends' config, the run's settings that
  shape training (`trainer.*`, `run.*`, `eval.*`, `policies.*`, the served model and the environment), one
  `key: value` each. No secret is a setting, so none is in it. The run's workflow fills in
  the trained policies and starts the feed (rollout.workflows.tracking).
- `tracking_state(client, run)` is what the feed last reported (its heartbeat's `TrackingState`, the record
  every face reads a feed's state as; once it
  has ended, its result), or None when the run has no feed or it has not reported yet; Temporal's own
  trouble is None too: tracking never stands in the way of a status.
- `settled_tracking(client, run, within_s)` is `tracking_state` once the feed has tried every backend (what
  `rollout train` says as the run ends: a backend that refused the whole run).
- `feeding(settings)` is the state of every feed still running (`rollout status`).
- `tracking_line(state)` is that state in one line for the live line and `rollout status`: each backend's
  count logged, or the setting to look at and why it refuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollout.config import TrackingBackend, WandbMode
from rollout.config.overrides import overrides_for
from rollout.workflows.tracking_types import TrackingState

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout.config import Settings
    from rollout.workflows.tracking_types import TrackingInput

__all__ = [
    "TrackingState",
    "feeding",
    "settled_tracking",
    "tracking_input",
    "tracking_line",
    "tracking_state",
]

# The settings that shape a run's training: what a researcher compares runs by.
CONFIG_SECTIONS = ("trainer", "run", "eval", "policies", "services.gateway.model", "services.engine.kind")


def tracking_input(settings: Settings, run: str, environment: str) -> TrackingInput | None:
    from rollout.workflows.tracking_types import MlflowSpec, OtlpSpec, TrackingInput, WandbSpec

    tracking = settings.tracking
    if not tracking.backends and tracking.otlp_endpoint is None:
        return None
    wandb = mlflow = None
    if TrackingBackend.wandb in tracking.backends:
        w = tracking.wandb
        wandb = WandbSpec(
            project=w.project,
            entity=w.entity,
            offline=w.mode == WandbMode.offline,
            name=w.name,
            group=w.group,
            tags=list(w.tags),
        )
    if TrackingBackend.mlflow in tracking.backends:
        m = tracking.mlflow
        mlflow = MlflowSpec(
            tracking_uri=m.tracking_uri, experiment=m.experiment, run_name=m.run_name, tags=dict(m.tags)
        )
    config = dict(override.split("=", 1) for override in overrides_for(settings, *CONFIG_SECTIONS))
    config["environment"] = environment
    return TrackingInput(
        run=run,
        policies=[],
        wandb=wandb,
        mlflow=mlflow,
        otlp=None if tracking.otlp_endpoint is None else OtlpSpec(tracking.otlp_endpoint),
        samples_every=tracking.samples_every,
        samples=tracking.samples,
        config=config,
        eval_every=settings.eval.every if settings.eval.suite is not None else 0,
    )


async def tracking_state(client: Client, run: str) -> TrackingState | None:
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
    from temporalio.service import RPCError

    from rollout.control.waits import READ_TIMEOUT
    from rollout.workflows.names import tracking_workflow_id

    handle = client.get_workflow_handle(tracking_workflow_id(run), result_type=TrackingState)
    try:
        description = await handle.describe(rpc_timeout=READ_TIMEOUT)
        if description.status == WorkflowExecutionStatus.COMPLETED:
            return await handle.result(rpc_timeout=READ_TIMEOUT)
    except (RPCError, WorkflowFailureError):
        return None
    for pending in description.raw_description.pending_activities:
        payloads = list(pending.heartbeat_details.payloads)
        if payloads:
            [state] = await client.data_converter.decode(payloads, [TrackingState])
            return state
    return None


async def feeding(settings: Settings) -> list[TrackingState]:
    """How the feed of every run whose feed is running stands (what `rollout status` shows); [] when Temporal
    does not answer."""
    from temporalio.service import RPCError

    from rollout.control.connections import connect_temporal
    from rollout.workflows.names import TRACKING_PREFIX
    from rollout.workflows.tracking import TrackingWorkflow

    try:
        client = await connect_temporal(settings)
        query = f"WorkflowType = '{TrackingWorkflow.__name__}' AND ExecutionStatus = 'Running'"
        runs = [w.id.removeprefix(TRACKING_PREFIX) async for w in client.list_workflows(query, limit=50)]
    except (RPCError, RuntimeError):
        return []
    states = [await tracking_state(client, run) for run in sorted(runs)]
    return [state for state in states if state is not None]


async def settled_tracking(client: Client, run: str, within_s: float) -> TrackingState | None:
    """The run's tracking state once the feed has tried every backend (waiting up to `within_s`: a short run
    can end before its feed's first report), or None when the run has no feed."""
    import asyncio
    import time

    deadline = time.monotonic() + within_s
    while True:
        state = await tracking_state(client, run)
        if state is None or all(b.tried for b in state.backends) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(1.0)


def tracking_line(state: TrackingState) -> str:
    parts = []
    for backend in state.backends:
        if backend.ok:
            parts.append(f"{backend.backend} {backend.logged} logged")
        else:  # the time to the next try is in the state, not the line: a line that changes would be said again
            parts.append(f"{backend.backend} refusing ({backend.setting}): {backend.error}; retrying")
    return "tracking: " + "; ".join(parts)
