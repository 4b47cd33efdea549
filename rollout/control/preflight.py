"""Before a run starts: a runner must be able to load its environment, and a trainer must poll each trainer
queue its policies name.

Contract: `confirm_runner_loads` starts `EnvironmentCheckWorkflow` on the runner queue and returns what the
runner found; it raises `PreflightFailed` with one paragraph (what failed, where it looked, what to do) when
the runner cannot import the environment or when no runner picks the check up in time. `confirm_trainers_poll`
raises `PreflightFailed` naming the setting when a policy's own trainer queue (`policies.NAME.trainer_queue`)
has no worker polling it. Nothing is recorded either way: a failed preflight leaves no run behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from rollout.control.errors import ControlError
from rollout.workflows.client import failure_reason, worker_polls
from rollout.workflows.episode_types import EnvironmentInfo
from rollout.workflows.names import RUNNER_QUEUE, preflight_workflow_id
from rollout.workflows.preflight import EnvironmentCheckWorkflow

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout.workflows.training_types import TrainingSpec

# A runner just (re)started by the stack needs a few seconds to poll; one killed during the check is noticed
# within its heartbeat timeout (30 s) and the check is tried again.
PICKUP_TIMEOUT_S = 90.0


class PreflightFailed(ControlError):
    """No runner can load the environment; nothing was started."""

    def __init__(self, message: str) -> None:
        super().__init__(message, usage=True)


async def confirm_runner_loads(
    client: Client, run: str, environment: str, *, timeout_s: float = PICKUP_TIMEOUT_S
) -> EnvironmentInfo:
    from temporalio.client import WorkflowFailureError
    from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

    handle = await client.start_workflow(
        EnvironmentCheckWorkflow.run,
        environment,
        id=preflight_workflow_id(run),
        task_queue=RUNNER_QUEUE,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        # Called again after Temporal went away, it joins the check already under way.
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    try:
        async with asyncio.timeout(timeout_s):
            return await handle.result()
    except TimeoutError:
        with contextlib.suppress(Exception):
            await handle.terminate("no runner picked up the environment check")
        raise PreflightFailed(
            f"no runner picked up the check of {environment} within {timeout_s:.0f} s on queue {RUNNER_QUEUE!r}: "
            "start the embedded stack's runner with `rollout up`, or your own with `rollout worker runner`, "
            "then start the run again."
        ) from None
    except WorkflowFailureError as error:
        reason = failure_reason(error)
        raise PreflightFailed(
            f"a runner cannot load {environment}: {reason}\nA runner imports environments from the installed "
            "packages, the folder it was started in and its $PYTHONPATH. Run this command from the folder that "
            "holds the module (the embedded stack's runner restarts to import from there), or start a runner "
            f"there yourself with `rollout worker runner`. `rollout env check {environment}` shows what is "
            "wrong with the environment itself. No run was started."
        ) from None


async def confirm_trainers_poll(client: Client, training: TrainingSpec, *, patience_s: float = 15.0) -> None:
    """Each policy with a trainer of its own (`PolicyModel.task_queue`) has one polling that queue: otherwise
    its training would wait for a worker that never comes. A worker just started polls within a second or
    two: each queue is looked at again for `patience_s` before the run is refused."""
    for policy, own in training.models.items():
        if own.task_queue and not await _polled_within(client, own.task_queue, patience_s):
            raise PreflightFailed(
                f"policies.{policy}.trainer_queue={own.task_queue}: no trainer worker polls that queue. Start one "
                f"(`rollout worker trainer --task-queue {own.task_queue}`; on a cluster, a policyModels entry "
                "with a trainer), or leave the setting unset to train the policy on the stack's trainer."
            )


async def _polled_within(client: Client, task_queue: str, patience_s: float) -> bool:
    deadline = asyncio.get_running_loop().time() + patience_s
    while not await worker_polls(client, task_queue):
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.5)
    return True
