"""`BridgeWorkflow` (`bridge/{policy}/{version}/{format}`): one checkpoint made servable in one format.

Deterministic workflow code only; activities through their stubs (rollout.workflows.trainer_stubs) on the
trainer queue, where the bridge activities run.

Contract: it converts the checkpoint (`bridge_checkpoint`, idempotent per checkpoint and format) and then
publishes its `ServingTarget` (`publish_serving`, once); followers beside the engines load it. A format the
checkpoint cannot give fails for good (`BridgeError`). `TrainingWorkflow` runs one per checkpoint and serving
format; `EvalWorkflow` runs one for a checkpoint that has no serving target yet (an SFT adapter).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from rollout.workflows import trainer_stubs
from rollout.workflows.options import heartbeating
from rollout.workflows.training_types import BridgeInput, BridgeResult

BRIDGE_RETRY = RetryPolicy(maximum_attempts=5, non_retryable_error_types=["BridgeError"])


@workflow.defn(name="BridgeWorkflow")
class BridgeWorkflow:
    """One checkpoint for one engine format: convert it (idempotent), then publish its serving target."""

    @workflow.run
    async def run(self, given: BridgeInput) -> BridgeResult:
        result = await workflow.execute_activity(
            trainer_stubs.bridge_checkpoint, given, **heartbeating(timedelta(minutes=30), BRIDGE_RETRY)
        )
        await workflow.execute_activity(
            trainer_stubs.publish_serving, given, **heartbeating(timedelta(minutes=30), BRIDGE_RETRY)
        )
        return result
