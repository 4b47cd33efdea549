"""The trainer worker: runs `TrainingWorkflow`s and `BridgeWorkflow`s and their activities on the trainer
queue.

Contract: one process holds the models it trains in memory (one `LocalTrainer`, or one Tinker training
client, per policy) and publishes their checkpoints under its trainer lease. Killing it loses nothing that was
published: a retried step resumes from its parent checkpoint in the blob store; a step it had not published is
trained again on the same batch. It registers one implementation of each stub in
rollout.workflows.trainer_stubs (`trainer_worker_activities`): the provider's training activities and the
bridges.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollout.activities.bridges import BridgeActivities
from rollout.activities.training import TrainingActivities
from rollout.workflows.bridges import BridgeWorkflow
from rollout.workflows.names import TRAINER_QUEUE
from rollout.workflows.training import TrainingWorkflow


def trainer_worker(
    client: Client,
    training: TrainingActivities,
    bridges: BridgeActivities,
    *,
    task_queue: str = TRAINER_QUEUE,
) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[TrainingWorkflow, BridgeWorkflow],
        activities=trainer_worker_activities(training, bridges),
        max_concurrent_activities=4,
        workflow_runner=UnsandboxedWorkflowRunner(),  # see rollout.workers.runner
    )


def trainer_worker_activities(
    training: TrainingActivities, bridges: BridgeActivities
) -> list[Callable[..., Awaitable[object]]]:
    """The activities a trainer worker registers: the provider's training activities, then the bridges."""
    return [
        training.assemble_batch,
        training.train_step,
        bridges.bridge_checkpoint,
        bridges.publish_serving,
        bridges.wait_served,
    ]
