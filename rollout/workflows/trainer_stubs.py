"""The trainer's activities as workflow code sees them: typed stubs, called by reference, never run.

Workflow modules cannot import the trainer's activities (they import torch, Tinker's SDK, the blob store),
so `TrainingWorkflow` and `BridgeWorkflow` call these: `workflow.execute_activity(trainer_stubs.train_step,
given, ...)` takes the activity's name and its argument and result types from the stub.

Contract:
- Each stub's function name is its activity's name on the wire (`@activity.defn` without a name), so renaming
  a stub renames the activity. Training activities have one implementation
  (`TrainingActivities` in rollout.activities.training, over a provider: local, data-parallel or Tinker),
  bridges one (`BridgeActivities` in rollout.activities.bridges); each
  takes the stub's name (`@activity.defn(name=trainer_stubs.train_step.__name__)`) and its parameter and
  return types, and the trainer worker (rollout.workers.trainer) registers each stub exactly once, whichever
  provider it runs, on `TRAINER_QUEUE`; tests/test_temporal_stubs.py checks both.
- A stub's body never runs: it raises `NotImplementedError`. Its docstring is the activity's contract.
"""

from __future__ import annotations

from temporalio import activity

from rollout.workflows.training_types import (
    AssembleInput,
    BatchLookup,
    BridgeInput,
    BridgeResult,
    CheckpointInfo,
    ServedWait,
    TrainStepInput,
)


@activity.defn
async def assemble_batch(given: AssembleInput) -> BatchLookup:
    """Assemble the batch of step (run, policy, step) from whole finished groups, recording `BatchAssembled`
    once per step (a retry returns the recorded batch); an empty lookup while no whole group is ready."""
    raise NotImplementedError


@activity.defn
async def train_step(given: TrainStepInput) -> CheckpointInfo:
    """Train one step on the recorded batch from `parent` and publish its checkpoint, exactly once per
    (policy, step), fenced by the policy's trainer lease (a step already published returns its checkpoint). A
    loss or gradient that is not finite publishes nothing and fails for good (`NonFiniteLoss`)."""
    raise NotImplementedError


@activity.defn
async def bridge_checkpoint(given: BridgeInput) -> BridgeResult:
    """Convert the checkpoint for one serving format and record `CheckpointConverted`, once per (checkpoint,
    format): a retry returns the recorded conversion. A format the checkpoint cannot give fails for good
    (`BridgeError`)."""
    raise NotImplementedError


@activity.defn
async def publish_serving(given: BridgeInput) -> None:
    """Publish the converted checkpoint's `ServingTarget`, once per checkpoint and serving format, for the
    followers beside the engines to load."""
    raise NotImplementedError


@activity.defn
async def wait_served(given: ServedWait) -> bool:
    """Wait (heartbeating) until some engine's newest ack serves the checkpoint: True, or False when the time
    is up."""
    raise NotImplementedError
