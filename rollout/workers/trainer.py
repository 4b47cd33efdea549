"""The trainer worker: runs `TrainingWorkflow`s and `BridgeWorkflow`s and their activities on the trainer queue.

Contract: one process holds the models it trains in memory (one `LocalTrainer`, or one Tinker training client,
per policy) and publishes their
checkpoints under its trainer lease. Killing it loses nothing that was published: a retried step resumes from
its parent checkpoint in the blob store; a step it had not published is trained again on the same batch.
"""

from __future__ import annotations

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollout.activities.bridges import BridgeActivities
from rollout.activities.local_training import LocalTrainingActivities
from rollout.activities.tinker_training import TinkerTrainingActivities
from rollout.workflows.training import BridgeWorkflow, TrainingWorkflow
from rollout.workflows.types import TRAINER_QUEUE


def trainer_worker(
    client: Client,
    training: LocalTrainingActivities | TinkerTrainingActivities,
    bridges: BridgeActivities,
    *,
    task_queue: str = TRAINER_QUEUE,
) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[TrainingWorkflow, BridgeWorkflow],
        activities=[
            training.assemble_batch,
            training.train_step,
            bridges.bridge_checkpoint,
            bridges.publish_serving,
            bridges.wait_served,
        ],
        max_concurrent_activities=4,
        workflow_runner=UnsandboxedWorkflowRunner(),  # see rollout.workers.runner
    )
