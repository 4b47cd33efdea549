"""The trainer worker's activities for the local provider: it keeps one trainer in memory per policy (a
`LocalTrainer`, or with `builder=DataParallel(...)` a group of them training data-parallel on Ray workers).

Contract:
- `assemble_batch` (the stub `trainer_stubs.assemble_batch`, for `TrainingWorkflow`) wraps
  `TrainerActivities.assemble_batch` in a `BatchLookup`.
- `train_step` is idempotent by (policy, step): a step already published returns its checkpoint. Otherwise it
  holds the policy's trainer lease (`rollout.activities.trainer_lease`), brings its trainer to `parent` (the
  checkpoint in memory, or resumed from the blob store, or the base model), trains on the recorded batch,
  saves, and publishes the checkpoint fenced by the lease, so an attempt that lost the lease (a zombie) cannot
  publish.
- A loss or gradient that is not finite fails the step for good (`NonFiniteLoss`): nothing is published. A
  step that fails otherwise, or is cancelled, drops the policy's trainer (its thread may still change it): the
  retry starts again from the parent checkpoint.
- One-GPU mode (`gpu_lease`): the step claims the ledger lease `gpu/{gpu}`, waits until every engine acking
  that GPU sleeps (or fails the attempt, retryably, after `ENGINES_ASLEEP_S`), builds or onloads its trainer,
  trains, saves and publishes, offloads the trainer to CPU memory, then releases the lease; the engines wake
  to the new checkpoint. The lease's TTL (`GPU_LEASE_TTL_S`) bounds a step: it is not renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollout.activities.heartbeat import heartbeating
from rollout.activities.trainer import TrainerActivities
from rollout.activities.trainer_lease import LEASE_TTL_S, PolicyLeases
from rollout.blobs import BlobStore
from rollout.ledger import Fence, Ledger
from rollout.ledger.streams import gpu_lease, policy_checkpoints_stream
from rollout.serving import EngineStates
from rollout.training.batches import Batch
from rollout.training.checkpoints import (
    CheckpointRecord,
    fetch_checkpoint,
    find_checkpoint,
    lineage_version,
    publish_checkpoint,
)
from rollout.training.local import LocalTrainerConfig, NonFiniteLoss, OneProcess, Trainer, TrainerBuilder
from rollout.training.losses import LossConfig, staleness_histogram
from rollout.workflows import trainer_stubs
from rollout.workflows.types import AssembleInput, BatchLookup, CheckpointInfo, TrainStepInput

GPU_LEASE_TTL_S = 1800.0
ENGINES_ASLEEP_S = 120.0


class LocalTrainingActivities:
    def __init__(
        self,
        ledger: Ledger,
        store: BlobStore,
        *,
        model_path: str,
        config: LocalTrainerConfig,
        loss: LossConfig,
        holder: str,
        scratch: Path | None = None,
        gpu_lease: str | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
        builder: TrainerBuilder | None = None,
    ) -> None:
        self.ledger, self.store = ledger, store
        self.model_path, self.config, self.loss = model_path, config, loss
        self.holder = holder
        self.scratch = scratch or Path(tempfile.mkdtemp(prefix="rollout-trainer-"))
        self.builder = builder or OneProcess()  # in this process, or data-parallel across Ray workers
        self.trainers: dict[str, tuple[Trainer, str | None]] = {}  # policy -> (trainer, checkpoint it is at)
        # How soon another trainer may take a dead one's policy over: the leases' TTL.
        self.leases = PolicyLeases(ledger, holder, lease_ttl_s)
        self.gpu_lease = gpu_lease
        self._torch_lock = threading.Lock()

    @activity.defn(name=trainer_stubs.assemble_batch.__name__)
    async def assemble_batch(self, given: AssembleInput) -> BatchLookup:
        async with heartbeating():
            return BatchLookup(await TrainerActivities(self.ledger).assemble_batch(given))

    @activity.defn(name=trainer_stubs.train_step.__name__)
    async def train_step(self, given: TrainStepInput) -> CheckpointInfo:
        published = await self.ledger.find(policy_checkpoints_stream(given.policy), f"step/{given.step}")
        if published is not None:
            return checkpoint_info(CheckpointRecord.from_payload(published.payload))
        if await self.leases.hold(given.policy):
            self.trainers.pop(given.policy, None)  # a new epoch: whatever we had in memory may be stale
        async with self.leases.kept(given.policy):
            batch = await TrainerActivities(self.ledger).load_batch(given.batch, given.advantage)
            # One-GPU mode: the trainer is built (or brought back from CPU memory) only once the device is
            # ours, and holds it until the checkpoint is published, so the engines wake to it.
            async with (
                self._gpu(),
                self._on_device(await self._trainer_at(given.policy, given.parent)) as trainer,
            ):
                try:
                    metrics = await asyncio.to_thread(self._one_at_a_time, trainer.step, batch)
                except NonFiniteLoss as error:
                    self.trainers.pop(given.policy, None)  # its optimiser state is no longer trustworthy
                    raise ApplicationError(str(error), type="NonFiniteLoss", non_retryable=True) from error
                except BaseException:
                    self.trainers.pop(
                        given.policy, None
                    )  # a failed step (a lost shard): rebuild from a checkpoint
                    raise
                directory = self.scratch / given.policy / f"step-{given.step:06d}"
                await asyncio.to_thread(trainer.save, directory)
                record = await publish_step(
                    self.ledger, self.store, self.leases.fence(given.policy), given, batch, directory, metrics
                )
        self.trainers[given.policy] = (trainer, record.name)
        return checkpoint_info(record)

    @contextlib.asynccontextmanager
    async def _gpu(self) -> AsyncIterator[None]:
        """One-GPU mode: hold the GPU's lease, and go on only once every engine on that GPU sleeps (an engine
        that does not within `ENGINES_ASLEEP_S` fails the attempt, retryably, with the lease let go)."""
        if self.gpu_lease is None:
            yield
            return
        resource = gpu_lease(self.gpu_lease)
        while (lease := await self.ledger.claim(resource, self.holder, GPU_LEASE_TTL_S)) is None:
            activity.heartbeat()
            await asyncio.sleep(1.0)
        try:
            if not await engines_asleep(self.ledger, self.gpu_lease, timeout_s=ENGINES_ASLEEP_S):
                raise ApplicationError(
                    f"the engines on GPU {self.gpu_lease!r} did not go to sleep within {ENGINES_ASLEEP_S:.0f} s "
                    "(is each one's follower running, with sleep mode on?); the step is tried again"
                )
            yield
        finally:
            await self.ledger.release(lease)

    @contextlib.asynccontextmanager
    async def _on_device(self, trainer: Trainer) -> AsyncIterator[Trainer]:
        """One-GPU mode: the trainer's weights and optimiser state are on the device for the step, and wait in
        CPU memory between steps."""
        if self.gpu_lease is None:
            yield trainer
            return
        await asyncio.to_thread(self._one_at_a_time, trainer.onload)
        try:
            yield trainer
        finally:
            await asyncio.to_thread(self._one_at_a_time, trainer.offload)

    async def _trainer_at(self, policy: str, parent: str | None) -> Trainer:
        if policy in self.trainers and self.trainers[policy][1] == parent:
            return self.trainers[policy][0]
        if parent is None:
            return await asyncio.to_thread(
                self._one_at_a_time, self.builder.build, self.model_path, self.config, self.loss
            )
        record = await self._record(policy, parent)
        directory = await asyncio.to_thread(
            fetch_checkpoint, self.store, record, self.scratch / policy / f"fetched-{parent}"
        )
        return await asyncio.to_thread(
            self._one_at_a_time, self.builder.resume, directory, self.config, self.loss
        )

    def _one_at_a_time[**P, T](self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Model building and training run in threads; a cancelled attempt's thread runs on, so a retry in the
        same process must wait for it (transformers cannot build two models at once in one process)."""
        with self._torch_lock:
            return work(*args, **kwargs)

    async def _record(self, policy: str, name: str) -> CheckpointRecord:
        record = await find_checkpoint(self.ledger, policy, name)
        if record is None:
            raise ApplicationError(
                f"checkpoint {name!r} of policy {policy!r} is not in the ledger", non_retryable=True
            )
        return record


async def engines_asleep(ledger: Ledger, gpu: str, *, timeout_s: float) -> bool:
    """Wait until every engine whose newest ack gives way to `gpu` sleeps (False if the time ran out)."""
    deadline = time.monotonic() + timeout_s
    states = EngineStates()
    while True:
        await states.refresh(ledger)
        if all(ack.sleeping for ack in states.values() if ack.gpu == gpu) or time.monotonic() > deadline:
            return time.monotonic() <= deadline
        activity.heartbeat()
        await asyncio.sleep(0.5)


async def publish_step(
    ledger: Ledger,
    store: BlobStore,
    fence: Fence,
    given: TrainStepInput,
    batch: Batch,
    directory: Path,
    metrics: dict[str, float],
) -> CheckpointRecord:
    """Publish a trained step's checkpoint (fenced) with its training metrics plus the batch's reward and
    staleness: the same record whichever provider trained it."""
    metrics = metrics | {
        "reward_mean": given.batch.reward_mean,
        "reward_std": given.batch.reward_std,
        "skipped_groups": float(given.batch.skipped_groups),
        # Staleness is against the newest checkpoint when this step started: its parent (not step - 1: a step
        # skipped for no signal publishes nothing).
        **staleness_metrics(lineage_version(given.policy, given.parent), batch),
    }
    return await publish_checkpoint(
        ledger,
        store,
        fence,
        run=given.run,
        policy=given.policy,
        step=given.step,
        parent=given.parent,
        directory=directory,
        metrics=metrics,
    )


def staleness_metrics(trained_version: int, batch: Batch) -> dict[str, float]:
    """How far behind the checkpoint being trained (`trained_version`) each sampled token's sampler was."""
    versions = [v for weighted in batch.segments for v in weighted.segment.sampled_versions]
    histogram = staleness_histogram(trained_version, versions) if versions else {}
    counts = {f"staleness_{lag}": float(n) for lag, n in histogram.items()}
    mean = sum(lag * n for lag, n in histogram.items()) / max(1, len(versions))
    return {"staleness_mean": mean, "staleness_max": float(max(histogram, default=0)), **counts}


def checkpoint_info(record: CheckpointRecord) -> CheckpointInfo:
    return CheckpointInfo(
        name=record.name, version=record.version, parent=record.parent, metrics=dict(record.metrics)
    )
