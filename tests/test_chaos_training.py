"""Chaos for training: real processes (local engine with its follower, gateway, runner, trainer workers)
killed under a real Temporal dev server and a real Postgres.

What must hold: a trainer SIGKILLed mid-step loses nothing (another trainer retries the step on the same
batch, exactly one `CheckpointCreated` per step, the dead trainer's lease epoch can no longer publish); an
engine SIGKILLed mid-run comes back, loads the checkpoint being served, and the gateway holds turns meanwhile
so no episode fails.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client

from rollout.blobs import FileBlobStore
from rollout.config import Settings
from rollout.ledger import Fence, Kind, Ledger, StaleFenceError
from rollout.ledger.queries import find_lease
from rollout.ledger.streams import SERVING_ACKS, policy_checkpoints_stream, run_batches_stream, trainer_lease
from rollout.records.serving import ServingAck
from rollout.run.settings import RunSettings, RunStatus
from rollout.training.checkpoints import publish_checkpoint
from rollout.workflows.names import run_policy, run_workflow_id, training_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout.workflows.training_types import TrainingSpec
from rollout_testing.cluster import Cluster, Service
from tests.test_chaos_episodes import wait_for

pytestmark = pytest.mark.slow


def training_run(run: str, steps: int, trainer_queue: str) -> RunInput:
    return RunInput(
        run,
        "tests.example_envs:coin",
        groups_in_flight=2,
        settings=RunSettings(max_lag=1, max_tokens=4),
        training=TrainingSpec(
            steps, groups_per_batch=1, wait_s=0.2, served_wait_s=120, task_queue=trainer_queue, heartbeat_s=6
        ),
    )


async def train_step_started(client: Client, workflow_id: str) -> bool:
    description = await client.get_workflow_handle(workflow_id).describe()
    return any(
        a.activity_type.name == "train_step"
        and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        for a in description.raw_description.pending_activities
    )


async def _a_trainer_killed_mid_step_loses_nothing_and_its_lease_can_no_longer_publish(
    cluster: Cluster, client: Client, ledger: Ledger, trainer_queue: str
) -> None:
    first = cluster.trainer("trainer-1", trainer_queue, "trainer.lease_ttl_s=4")
    run = f"chaos-train-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        RunWorkflow.run,
        training_run(run, 2, trainer_queue),
        id=run_workflow_id(run),
        task_queue=cluster.task_queue,
    )
    training_id = training_workflow_id(run, "default")

    async def started() -> bool:
        try:
            return await train_step_started(client, training_id)
        except Exception:  # not started yet
            return False

    await wait_for(started, 120, "the first train_step to start")
    policy = run_policy(run, "default")

    async def first_holds_the_lease() -> bool:
        lease = await find_lease(ledger, trainer_lease(policy))
        return lease is not None and lease.holder == "trainer-1"

    # Killed once it holds the lease (a loaded machine may still be starting the step before that), so the
    # second trainer's claim must fence the first one's epoch out.
    await wait_for(first_holds_the_lease, 120, "the first trainer to hold the policy's lease")
    first.kill()  # mid-step: it was loading the model or training
    assert not [
        e for e in await ledger.read(policy_checkpoints_stream(policy)) if e.kind == Kind.CHECKPOINT_CREATED
    ], "the killed step published nothing"
    cluster.trainer("trainer-2", trainer_queue, "trainer.lease_ttl_s=4")
    status: RunStatus = await asyncio.wait_for(handle.result(), 300)
    assert status.trained == {"default": f"{policy}-step000002"} and status.episodes_failed == 0

    created = [
        e for e in await ledger.read(policy_checkpoints_stream(policy)) if e.kind == Kind.CHECKPOINT_CREATED
    ]
    assert [e.key for e in created] == ["step/1", "step/2"], "exactly one CheckpointCreated per step"
    batches = [
        e for e in await ledger.read(run_batches_stream(run, policy)) if e.kind == Kind.BATCH_ASSEMBLED
    ]
    assert [e.key for e in batches] == ["step/1", "step/2"], (
        "the retried step trained on the batch recorded once"
    )
    assert created[0].payload["metrics"]["tokens"] == batches[0].payload["sampled_tokens"]
    history = [e async for e in client.get_workflow_handle(training_id).fetch_history_events()]
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert max(attempts) >= 2, "a train_step was retried after the kill"
    # The dead trainer's lease epoch is fenced out: a late write from it is refused.
    lease = await find_lease(ledger, trainer_lease(policy))
    assert lease is not None and lease.holder == "trainer-2" and lease.epoch >= 2
    stale = Fence(trainer_lease(policy), 1)
    scratch = cluster.root / "zombie"
    scratch.mkdir()
    (scratch / "adapter_config.json").write_text("{}")
    with pytest.raises(StaleFenceError):
        await publish_checkpoint(
            ledger,
            FileBlobStore(cluster.root / "blobs"),
            stale,
            run=run,
            policy=policy,
            step=3,
            parent=f"{policy}-step000002",
            directory=scratch,
        )


async def _an_engine_killed_mid_run_comes_back_serving_the_checkpoint_and_no_episode_fails(
    cluster: Cluster, client: Client, ledger: Ledger, trainer_queue: str, engine: Service, port: int
) -> None:
    run = f"chaos-engine-{uuid.uuid4().hex[:6]}"
    policy = run_policy(run, "default")
    first = f"{policy}-step000001"
    handle = await client.start_workflow(
        RunWorkflow.run,
        training_run(run, 3, trainer_queue),
        id=run_workflow_id(run),
        task_queue=cluster.task_queue,
    )

    async def engine_acks() -> list[ServingAck]:
        return [
            ServingAck.from_payload(dict(e.payload))
            for e in await ledger.read(SERVING_ACKS, limit=100000)
            if e.payload["engine"] == "engine-k"
        ]

    async def serving_first() -> bool:
        return any(ack.serves(first) for ack in await engine_acks())

    await wait_for(serving_first, 180, "the engine to serve the first checkpoint")
    killed_incarnation = (await engine_acks())[-1].incarnation
    engine.kill()
    await asyncio.sleep(2)  # turns arriving now are held by the gateway
    started = time.monotonic()
    cluster.local_engine("engine-k", port=port)

    async def reloaded() -> ServingAck | None:
        return next(
            (a for a in await engine_acks() if a.incarnation != killed_incarnation and a.serving), None
        )

    ack = await wait_for(reloaded, 120, "the restarted engine to load the served checkpoint")
    assert ack.serving[0].version >= 1, "it loaded a trained checkpoint, not just the base"
    status: RunStatus = await asyncio.wait_for(handle.result(), 300)
    assert status.episodes_failed == 0, "the gateway held turns while the engine was down"
    assert status.trained == {"default": f"{policy}-step000003"}
    assert time.monotonic() - started < 300


async def test_a_trainer_then_an_engine_killed_mid_run_lose_nothing(
    cluster: Cluster, stack_settings: Settings, ledger: Ledger
) -> None:
    """One cluster for both kills (its start is most of each part's time): a trainer killed mid-step on a
    first run, then, with the second trainer serving, the engine killed mid-run on a second."""
    client = await Client.connect(stack_settings.temporal_address)
    engine, engine_url = cluster.local_engine("engine-k")
    port = int(engine_url.rsplit(":", 1)[1])
    gateway_url = cluster.gateway(engine_url)
    cluster.runner("runner-1", gateway_url)
    trainer_queue = f"{cluster.task_queue}-trainer"
    await _a_trainer_killed_mid_step_loses_nothing_and_its_lease_can_no_longer_publish(
        cluster, client, ledger, trainer_queue
    )
    await _an_engine_killed_mid_run_comes_back_serving_the_checkpoint_and_no_episode_fails(
        cluster, client, ledger, trainer_queue, engine, port
    )
