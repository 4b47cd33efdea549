"""One metrics record per training step, built from the ledger alone: what `rollout run status --json` shows
and what a tracker logs.

Contract:
- `step_metrics(ledger, run, policy)` returns a `StepMetrics` for every complete step of one policy, in step
  order: a trained step (with its checkpoint's metrics) and a step skipped because every group tied (no
  checkpoint: its trainer fields are None). The newest step whose batch is recorded but not yet published
  is being trained: it is left out until it publishes, so a record, once returned, never changes. A step
  that ended without a checkpoint (its loss was not finite: the run assembles the next batch only once a
  step has ended) is left out for good. `newest_step_metrics` is the last of them, reading only its own
  episodes. `recorded_steps` is those steps as the ledger holds them (their batch and checkpoint payloads).
- Every number comes from durable events: the step's `BatchAssembled`, its `CheckpointCreated` (the trainer's
  metrics and what the activity added: staleness, prefix-cache hit rate, advantage spread, reply lengths) and
  the `EpisodeFinished`/`EpisodeAbandoned` of the episodes the batch consumed. A reader can come and go; two
  readers at the same ledger position return the same records.
- A field a step's writer did not record (an older run, a provider that does not measure it) is None, never a
  made-up 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from rollout.ledger import Ledger
from rollout.ledger.payloads import EpisodeEnded, episode_ended, episode_ended_key
from rollout.ledger.queries import read_all
from rollout.ledger.records import records_of
from rollout.ledger.streams import policy_checkpoints_stream, run_batches_stream, run_episodes_stream
from rollout.records.batches import BatchInfo
from rollout.records.checkpoints import CheckpointRecord
from rollout.workflows.names import run_policy


@dataclass(frozen=True)
class StepMetrics:
    """One step of one policy."""

    run: str
    policy: str  # the policy's name in the environment ("default" for a one-policy run)
    environment: str  # the run's environment as its episodes recorded it (its reference, `module:attribute`)
    step: int  # 1, 2, …: skipped steps count too; what a tracker indexes by
    trained: bool  # False: every group of the batch tied (no signal), so no checkpoint and no trainer fields
    checkpoint: str | None  # the checkpoint the step published (None when skipped)
    # The checkpoint it trained from (None: the base model, or skipped); after an eval gate's rollback, an
    # older checkpoint than the previous step's.
    parent: str | None
    recorded_at: str  # ISO 8601: when the checkpoint (a skipped step: its batch) was recorded
    step_s: float | None  # seconds since the previous step was recorded (None for the first)

    # The batch (rollout.activities.batches).
    reward_mean: float  # this policy's reward over every episode of every group drawn, replaced ones included
    reward_std: float
    # The kept groups' episodes (refill's replaced groups are not counted here): a failed episode is consumed
    # with its group, never trained.
    episodes: int
    episodes_failed: int
    turns: int  # over those episodes and every agent in them
    failures: dict[str, int]  # those that failed, by kind (rollout.run.failures: TaskFailed, TaskTimedOut, …)
    groups_drawn: int  # kept + replaced by refill
    groups_kept: int
    groups_replaced: int  # tied groups refill consumed without training, each replaced by a fresh group
    groups_skipped: int  # kept groups without signal (every reward equal): not trained
    tokens_trained: int  # sampled tokens the step trained on (0 when skipped)
    prompt_tokens: int  # sent to the engines over the batch's turns
    cached_tokens: int  # of those, held by the engines' prefix caches

    # The trainer (rollout.training.local, rollout.rl.losses): None when skipped or not measured.
    loss: float | None = None
    grad_norm: float | None = None  # before clipping
    kl: float | None = None  # sampler–trainer KL, k3 estimator: mean((r − 1) − log r), r = π_old/μ
    entropy: float | None = None  # π_θ's mean next-token entropy over the sampled tokens, nats
    clipped_fraction: float | None = None  # sampled tokens whose ratio or weight the loss clipped
    masked_fraction: float | None = None  # dropped by IcePop's bounds
    effective_sample_size: float | None = None  # of the importance ratios π_θ/μ, in (0, 1]
    weight_ess: float | None = None  # of the weights the loss applied
    staleness_mean: float | None = None  # checkpoints between a token's sampler and the newest, mean
    staleness_max: float | None = None
    advantage_std: float | None = None  # over the trained segments
    response_tokens_mean: float | None = None  # a reply: one turn's run of sampled tokens
    response_tokens_max: float | None = None
    prefix_cache_hit_rate: float | None = None  # cached / prompt tokens of the trained segments
    computed_tokens: float | None = None  # what the trainer's forward passes computed (shared prefixes once)
    train_s: float | None = None  # the trainer's own time on the step
    tokens_trained_per_s: float | None = None  # tokens_trained / train_s
    tokens_sampled_per_s: float | None = None  # tokens_trained / step_s: the rate the step's data came in
    # The model FLOPs the trainer computed per second (rollout.training.flops: 4N + 2N_trainable a token), and
    # where the trainer's GPU is one whose peak is known, that peak (dense bf16) and the share of it used.
    model_tflops_per_s: float | None = None
    peak_tflops: float | None = None
    mfu: float | None = None

    extra: dict[str, float] = field(default_factory=dict[str, float])  # any other metric the step recorded

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Checkpoint metrics that are fields of their own (under another name where the ledger's is a formula's).
_RENAMED = {"kl_k3": "kl"}
_FIELDS = (
    "loss",
    "grad_norm",
    "kl",
    "entropy",
    "clipped_fraction",
    "masked_fraction",
    "effective_sample_size",
    "weight_ess",
    "staleness_mean",
    "staleness_max",
    "advantage_std",
    "response_tokens_mean",
    "response_tokens_max",
    "prefix_cache_hit_rate",
    "computed_tokens",
    "train_s",
    "model_tflops_per_s",
    "peak_tflops",
    "mfu",
)
# Recorded for the record's other fields already (the batch's), or per-bucket counts: not `extra`.
_NOT_EXTRA = {
    "step",
    "reward_mean",
    "reward_std",
    "skipped_groups",
    "groups_drawn",
    "groups_kept",
    "groups_replaced",
    "tokens",
    "segment_tokens",
}


@dataclass(frozen=True)
class RecordedStep:
    """A complete step as the ledger holds it: what `StepMetrics` and a step's trace are built from."""

    batch: BatchInfo
    at: datetime  # when its checkpoint (skipped: its batch) was recorded
    checkpoint: CheckpointRecord | None  # its `CheckpointCreated` (None when skipped)
    batch_at: datetime  # when its batch was recorded (training starts)


async def recorded_steps(ledger: Ledger, run: str, ledger_policy: str) -> list[RecordedStep]:
    """The policy's complete steps, in step order (see the module contract). A payload on these streams that
    is not a batch or a checkpoint (any ledger writer may append there) is passed over."""
    batches = sorted(
        (
            (event.recorded_at, batch)
            for event in await read_all(ledger, run_batches_stream(run, ledger_policy))
            for batch in records_of([event], BatchInfo)
        ),
        key=lambda b: b[1].step,
    )
    checkpoints = {
        event.key: (event.recorded_at, record)
        for event in await read_all(ledger, policy_checkpoints_stream(ledger_policy))
        for record in records_of([event], CheckpointRecord)
    }
    steps: list[RecordedStep] = []
    for index, (batch_at, batch) in enumerate(batches):
        published = checkpoints.get(f"step/{batch.step}")
        if published is not None:
            steps.append(RecordedStep(batch, published[0], published[1], batch_at))
        elif not batch.sampled_tokens:
            steps.append(RecordedStep(batch, batch_at, None, batch_at))  # skipped: every group tied
        elif index == len(batches) - 1:
            break  # being trained (the next step's batch is assembled only once this one has ended)
        # else: its training ended without a checkpoint (a loss that was not finite): it never will publish
    return steps


async def step_metrics(ledger: Ledger, run: str, policy: str) -> list[StepMetrics]:
    """Every complete step of `policy` (its name in the environment) in run `run`, oldest first."""
    steps = await recorded_steps(ledger, run, run_policy(run, policy))
    episodes = {
        ended.episode: ended
        for e in await read_all(ledger, run_episodes_stream(run))
        if (ended := episode_ended(e)) is not None
    }
    return [
        _record(
            run,
            policy,
            step,
            [episodes[e] for e in step.batch.episodes if e in episodes],
            steps[index - 1].at if index else None,
        )
        for index, step in enumerate(steps)
    ]


async def newest_step_metrics(ledger: Ledger, run: str, policy: str) -> StepMetrics | None:
    """The newest complete step of `policy`, reading only its own episodes (what `run status` shows)."""
    steps = await recorded_steps(ledger, run, run_policy(run, policy))
    if not steps:
        return None
    newest = steps[-1]
    stream = run_episodes_stream(run)
    consumed: list[EpisodeEnded] = []
    for episode in newest.batch.episodes:
        for finished in (True, False):
            event = await ledger.find(stream, episode_ended_key(episode, finished=finished))
            if event is not None and (ended := episode_ended(event)) is not None:
                consumed.append(ended)
                break
    return _record(run, policy, newest, consumed, steps[-2].at if len(steps) > 1 else None)


def _record(
    run: str, policy: str, step: RecordedStep, consumed: list[EpisodeEnded], previous: datetime | None
) -> StepMetrics:
    batch, at, checkpoint = step.batch, step.at, step.checkpoint
    recorded = {_RENAMED.get(k, k): v for k, v in (checkpoint.metrics if checkpoint else {}).items()}
    trainer = {name: recorded.get(name) for name in _FIELDS}
    train_s = trainer["train_s"]
    step_s = None if previous is None else (at - previous).total_seconds()
    extra = {
        k: v
        for k, v in recorded.items()
        if k not in _FIELDS and k not in _NOT_EXTRA and not k.startswith("staleness_")
    }
    return StepMetrics(
        run=run,
        policy=policy,
        environment=next((e.environment for e in consumed if e.environment), ""),
        step=batch.step,
        trained=checkpoint is not None,
        checkpoint=checkpoint.name if checkpoint else None,
        parent=checkpoint.parent if checkpoint else None,
        recorded_at=at.isoformat(),
        step_s=step_s,
        reward_mean=batch.reward_mean,
        reward_std=batch.reward_std,
        episodes=len(batch.episodes),
        episodes_failed=sum(1 for e in consumed if not e.finished),
        turns=sum(sum(e.turns.values()) for e in consumed),
        failures=dict(Counter(e.failure.kind if e.failure else "failed" for e in consumed if not e.finished)),
        groups_drawn=batch.groups_drawn or len(batch.groups),
        groups_kept=batch.groups_kept or len(batch.groups),
        groups_replaced=batch.groups_replaced,
        groups_skipped=batch.skipped_groups,
        tokens_trained=batch.sampled_tokens,
        prompt_tokens=batch.prompt_tokens,
        cached_tokens=batch.cached_tokens,
        tokens_trained_per_s=batch.sampled_tokens / train_s if train_s else None,
        tokens_sampled_per_s=batch.sampled_tokens / step_s if step_s else None,
        extra=extra,
        **trainer,
    )
