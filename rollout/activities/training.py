"""The trainer worker's training activities: one protocol (Temporal and the ledger) over a provider that
trains.

Contract:
- `assemble_batch` (the stub `trainer_stubs.assemble_batch`, for `TrainingWorkflow`) records a step's batch
  once (rollout.activities.batches) and answers with a `BatchLookup`: the batch, and the groups refill has
  replaced so far.
- `train_step` is idempotent by (policy, step): a step already published returns its checkpoint. Otherwise it
  holds the policy's trainer lease (rollout.activities.trainer_lease), loads the recorded batch, and has the
  provider train it from `parent` and publish the checkpoint through the `Publish` it is given: fenced by the
  lease, so an attempt that lost the lease (a zombie) cannot publish, and with the batch's reward, staleness,
  groups drawn, kept and replaced, prefix-cache hit rate, advantage spread and reply lengths beside the
  provider's metrics, the same record whichever provider trained it.
- A provider's `NonFiniteLoss` fails the step for good (the activity error's type names it): nothing is
  published. A step that fails otherwise, or is cancelled, or a lease taken at a new epoch, has the provider
  `forget` the policy (what it holds in memory may be stale): the retry starts again from the parent
  checkpoint.
- `TrainingProvider` is that seam: `LocalProvider` (torch + peft in this process, or data-parallel on Ray
  workers; rollout.activities.local_training) and `TinkerProvider` (Tinker's hosted trainer;
  rollout.activities.tinker_training) implement it.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollout.activities.batches import load_batch, look_for_batch
from rollout.activities.heartbeat import heartbeating
from rollout.activities.trainer_lease import LEASE_TTL_S, PolicyLeases
from rollout.blobs import BlobStore
from rollout.ledger import Fence, Ledger
from rollout.ledger.streams import trainer_lease
from rollout.records.checkpoints import CheckpointRecord
from rollout.rl.batches import Batch
from rollout.rl.losses import NonFiniteLoss, staleness_histogram
from rollout.training.checkpoints import (
    ForeignCheckpoint,
    find_checkpoint,
    lineage_version,
    publish_checkpoint,
    published_step,
)
from rollout.workflows import trainer_stubs
from rollout.workflows.training_types import AssembleInput, BatchLookup, CheckpointInfo, TrainStepInput

# Publish a trained step: the checkpoint's directory and the provider's metrics in, the published record out.
type Publish = Callable[[Path, dict[str, float]], Awaitable[CheckpointRecord]]


class TrainingProvider(Protocol):
    """What trains: one step of one policy, from its parent checkpoint."""

    async def step(self, given: TrainStepInput, batch: Batch, publish: Publish) -> CheckpointRecord:
        """Bring the policy's trainer to `given.parent`, train one step on `batch`, write the checkpoint to a
        directory and `publish` it (once), returning the published record. A loss that is not finite raises
        `NonFiniteLoss` before any weight changes."""
        ...

    def forget(self, policy: str) -> None:
        """Drop whatever the provider holds in memory for `policy`: the next step starts from its parent."""
        ...


class TrainingActivities:
    def __init__(
        self,
        ledger: Ledger,
        store: BlobStore,
        provider: TrainingProvider,
        *,
        holder: str,
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> None:
        self.ledger, self.store, self.provider = ledger, store, provider
        # How soon another trainer may take a dead one's policy over: the leases' TTL.
        self.leases = PolicyLeases(ledger, holder, lease_ttl_s)

    @activity.defn(name=trainer_stubs.assemble_batch.__name__)
    async def assemble_batch(self, given: AssembleInput) -> BatchLookup:
        async with heartbeating():
            return await look_for_batch(self.ledger, given)

    @activity.defn(name=trainer_stubs.train_step.__name__)
    async def train_step(self, given: TrainStepInput) -> CheckpointInfo:
        try:
            published = await published_step(
                self.ledger, given.policy, given.step, trainer_lease(given.policy)
            )
        except ForeignCheckpoint as error:
            raise ApplicationError(str(error), type="ForeignCheckpoint", non_retryable=True) from error
        if published is not None:
            return checkpoint_info(published)
        if await self.leases.hold(given.policy):
            self.provider.forget(given.policy)  # a new epoch: another holder may have moved on
        async with self.leases.kept(given.policy):
            batch = await load_batch(self.ledger, given.batch, given.advantage)
            fence = self.leases.fence(given.policy)

            async def publish(directory: Path, metrics: dict[str, float]) -> CheckpointRecord:
                return await publish_step(self.ledger, self.store, fence, given, batch, directory, metrics)

            try:
                record = await self.provider.step(given, batch, publish)
            except NonFiniteLoss as error:
                self.provider.forget(given.policy)  # its optimiser state is no longer trustworthy
                raise ApplicationError(str(error), type="NonFiniteLoss", non_retryable=True) from error
            except BaseException:
                self.provider.forget(given.policy)  # a failed step (a lost shard): rebuild from a checkpoint
                raise
        return checkpoint_info(record)


async def parent_record(ledger: Ledger, policy: str, name: str) -> CheckpointRecord:
    """The published checkpoint a step trains from; one the ledger lacks fails the step for good."""
    record = await find_checkpoint(ledger, policy, name)
    if record is None:
        raise ApplicationError(
            f"checkpoint {name!r} of policy {policy!r} is not in the ledger", non_retryable=True
        )
    return record


async def publish_step(
    ledger: Ledger,
    store: BlobStore,
    fence: Fence,
    given: TrainStepInput,
    batch: Batch,
    directory: Path,
    metrics: dict[str, float],
) -> CheckpointRecord:
    """Publish a trained step's checkpoint (fenced) with its training metrics plus the batch's reward,
    staleness, prefix-cache hit rate, advantage spread and reply lengths."""
    metrics = metrics | {
        "reward_mean": given.batch.reward_mean,
        "reward_std": given.batch.reward_std,
        "skipped_groups": float(given.batch.skipped_groups),
        # Refill: the groups the step drew, kept and replaced (tied groups swapped for fresh ones).
        "groups_drawn": float(given.batch.groups_drawn or len(given.batch.groups)),
        "groups_kept": float(given.batch.groups_kept or len(given.batch.groups)),
        "groups_replaced": float(given.batch.groups_replaced),
        # Staleness is against the newest checkpoint when this step started: its parent (not step - 1: a step
        # skipped for no signal publishes nothing), or the newest after a rollback to an older parent.
        **staleness_metrics(lineage_version(given.policy, given.newest or given.parent), batch),
        **prefix_cache_metrics(batch),
        **batch_shape_metrics(batch),
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


def batch_shape_metrics(batch: Batch) -> dict[str, float]:
    """How the trained segments' advantages spread (`advantage_std`, `advantage_abs_mean`, over segments) and
    how long their replies were (`response_tokens_mean`, `response_tokens_max`: a reply is a run of sampled
    tokens, one turn's answer)."""
    advantages = [weighted.advantage for weighted in batch.segments]
    replies = [
        len(list(run))
        for weighted in batch.segments
        for sampled, run in itertools.groupby(weighted.segment.mask_T)
        if sampled
    ]
    if not advantages or not replies:
        return {}
    return {
        "advantage_std": statistics.pstdev(advantages),
        "advantage_abs_mean": statistics.fmean(abs(a) for a in advantages),
        "response_tokens_mean": statistics.fmean(replies),
        "response_tokens_max": float(max(replies)),
    }


def prefix_cache_metrics(batch: Batch) -> dict[str, float]:
    """The share of the batch's prompt tokens its engines took from their prefix caches (absent when no turn
    said)."""
    prompt = sum(weighted.segment.prompt_tokens for weighted in batch.segments)
    cached = sum(weighted.segment.cached_tokens for weighted in batch.segments)
    return {"prefix_cache_hit_rate": cached / prompt} if prompt else {}


def checkpoint_info(record: CheckpointRecord) -> CheckpointInfo:
    return CheckpointInfo(
        name=record.name, version=record.version, parent=record.parent, metrics=dict(record.metrics)
    )
