"""Where a training run is, read from the ledger alone: the live line of `rollout train` and `rollout run
attach`, and the summary they end with.

Contract:
- `TrainingProgress` reads checkpoints with their metrics, which of them an engine has served, the batches
  assembled (and which were skipped: every group's rewards equal, so no signal; how many tied groups refill
  replaced by fresh ones; and the share of their prompt tokens the engines' prefix caches held, skipped or
  not), episodes finished, and why episodes failed (the top reasons, with where in the environment's code).
  Each is read as its record; a payload that does not parse (forged: any ledger writer may append) is passed
  over. It
  shows only what is durable, so a reader can come and go (a killed `rollout train`, a later `run attach`).
  One reads one policy's lineage; `run_line` puts a run's policies side by side.
- Nothing here decides anything a workflow decides: stopping at `trainer.steps` is `RunWorkflow`'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import FailureCount, count_events, failure_counts
from rollout.ledger.records import records_of
from rollout.ledger.streams import (
    SERVING_ACKS,
    policy_checkpoints_stream,
    run_batches_stream,
    run_episodes_stream,
)
from rollout.records.batches import BatchInfo
from rollout.records.checkpoints import CheckpointRecord
from rollout.records.serving import ServingAck
from rollout.run.failures import advice
from rollout.workflows.names import run_policy


@dataclass
class Step:
    version: int
    name: str
    metrics: dict[str, float]


@dataclass
class TrainingProgress:
    run: str
    policy: str
    steps: list[Step] = field(default_factory=list[Step])
    served: set[str] = field(default_factory=set[str])
    episodes: int = 0
    batches: int = 0
    batches_skipped: int = 0  # every group of the batch had equal rewards: nothing to learn from, no step
    groups_skipped: int = 0  # groups without signal, in skipped and trained batches alike
    groups_replaced: int = 0  # tied groups refill consumed without training, each replaced by a fresh group
    prompt_tokens: int = 0  # sent to the engines over the batches' turns
    cached_tokens: int = 0  # of those, held by the engines' prefix caches
    failures: list[FailureCount] = field(
        default_factory=list[FailureCount]
    )  # why episodes failed, most first
    _acks_cursor: int = 0

    @property
    def ledger_policy(self) -> str:
        return run_policy(self.run, self.policy)

    async def refresh(self, ledger: Ledger) -> None:
        created = await ledger.read(policy_checkpoints_stream(self.ledger_policy), limit=100000)
        self.steps = [
            Step(version=c.version, name=c.name, metrics=dict(c.metrics))
            for c in records_of(created, CheckpointRecord)
        ]
        assembled = await ledger.read(run_batches_stream(self.run, self.ledger_policy), limit=100000)
        batches = records_of(assembled, BatchInfo)
        self.batches = len(batches)
        self.batches_skipped = sum(1 for b in batches if b.sampled_tokens == 0)
        self.prompt_tokens = sum(b.prompt_tokens for b in batches)
        self.cached_tokens = sum(b.cached_tokens for b in batches)
        self.groups_skipped = sum(b.skipped_groups for b in batches)
        self.groups_replaced = sum(b.groups_replaced for b in batches)
        while events := await ledger.read(SERVING_ACKS, after=self._acks_cursor):
            self._acks_cursor = events[-1].seq
            for ack in records_of(events, ServingAck):
                self.served |= {s.checkpoint for s in ack.serving if s.policy == self.ledger_policy}
        self.episodes = await count_events(ledger, run_episodes_stream(self.run), Kind.EPISODE_FINISHED)
        self.failures = await failure_counts(ledger, self.run)

    def failed(self) -> str:
        """` · N failed: the top reason (where)`, or "" when no episode failed."""
        if not self.failures:
            return ""
        top = self.failures[0]
        more = f" (+{len(self.failures) - 1} other reasons)" if len(self.failures) > 1 else ""
        return f" · {top.count} failed: {top.summary}{more}"

    @property
    def newest(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def cache(self) -> str:
        """` · cache N%`: the share of the batches' prompt tokens the engines' prefix caches held ("" before
        any batch)."""
        return f" · cache {self.cached_tokens / self.prompt_tokens:.0%}" if self.prompt_tokens else ""

    def refilled(self) -> str:
        """` · refilled N`: the tied groups refill replaced by fresh ones ("" when none)."""
        return f" · refilled {self.groups_replaced}" if self.groups_replaced else ""

    def line(self) -> str:
        """One line for the live display: step, reward, staleness, KL, served, episodes, skipped batches,
        groups refilled, the prefix caches' hit rate."""
        skipped = f" · {self.batches_skipped} batches skipped (no signal)" if self.batches_skipped else ""
        skipped += self.refilled()
        if self.newest is None:
            return f"waiting for the first batch · {self.episodes} episodes played{skipped}{self.cache()}{self.failed()}"
        return f"{self.policy_line()} · {self.episodes} episodes{skipped}{self.cache()}{self.failed()}"

    def policy_line(self) -> str:
        """This policy's part of the line: its step, reward, staleness, KL and what was served of it."""
        newest = self.newest
        if newest is None:
            return "waiting for its first batch"
        m = newest.metrics
        return (
            f"step {newest.version} · reward {m.get('reward_mean', float('nan')):.3f} · staleness "
            f"{m.get('staleness_mean', 0.0):.2f} · KL {m.get('kl_k3', 0.0):.4f} · served "
            f"{len(self.served)}/{len(self.steps)}"
        )

    def skipped_reason(self) -> str | None:
        """Why batches were skipped, in a sentence; None when none were."""
        if not self.batches_skipped:
            return None
        refill = (
            f" (refill replaced {self.groups_replaced} tied groups by fresh ones, up to trainer.refill_max per "
            "step, and found no signal in those either)"
            if self.groups_replaced
            else ""
        )
        return (
            f"{self.batches_skipped} of {self.batches} batches were skipped: in each, every group's episodes got "
            f"the same reward, so there was no signal to learn from{refill}. Make the task easier (or the reward "
            "less sparse: partial credit), sample more diversely (a higher temperature), or use larger groups."
        )

    def reward_change(self) -> tuple[int, float, float] | None:
        """(window, mean reward of the first `window` steps, of the last `window`): whether the run learned,
        in numbers. The window is 10 steps, or half the steps of a shorter run; None under 4 steps."""
        rewards = [s.metrics.get("reward_mean") for s in self.steps]
        finite = [float(r) for r in rewards if r is not None and r == r]  # NaN != NaN
        if len(finite) < 4:
            return None
        window = min(10, len(finite) // 2)
        return window, sum(finite[:window]) / window, sum(finite[-window:]) / window

    def learned(self) -> str | None:
        """The reward's change as a sentence (None under 4 steps)."""
        change = self.reward_change()
        if change is None:
            return None
        window, first, last = change
        if round(last, 3) == round(first, 3):
            return f"reward did not move: {first:.3f} (mean of the first {window} steps and of the last {window})"
        moved = "rose" if last > first else "fell"
        return (
            f"reward {moved} from {first:.3f} (mean of the first {window} steps) to {last:.3f} (the last "
            f"{window}): {last - first:+.3f}"
        )

    def failures_said(self) -> list[str]:
        """What failed and what to change, a sentence per way episodes failed."""
        return [
            f"{f.count} episode(s) failed: {f.summary} (e.g. episode {f.episode}). {advice(f.kind)}"
            for f in self.failures
        ]

    def summary(self) -> dict[str, Any]:
        change = self.reward_change()
        return {
            "run": self.run,
            "policy": self.ledger_policy,
            "steps": len(self.steps),
            "checkpoints": [s.name for s in self.steps],
            "served": sorted(self.served),
            "episodes": self.episodes,
            "batches": self.batches,
            "batches_skipped": self.batches_skipped,
            "groups_skipped": self.groups_skipped,
            "groups_replaced": self.groups_replaced,
            "skipped_reason": self.skipped_reason(),
            "reward_by_step": [round(s.metrics.get("reward_mean", float("nan")), 4) for s in self.steps],
            "reward_first": None if change is None else round(change[1], 4),
            "reward_last": None if change is None else round(change[2], 4),
            "reward_window": None if change is None else change[0],
            "failures": [asdict(f) | {"summary": f.summary, "advice": advice(f.kind)} for f in self.failures],
        }


def run_line(progresses: Sequence[TrainingProgress]) -> str:
    """The live line of a run: its one policy's `line()`, or each policy's part side by side, then the run's
    episodes, skipped batches, groups refilled and failures."""
    if len(progresses) == 1:
        return progresses[0].line()
    first = progresses[0]
    skipped = sum(p.batches_skipped for p in progresses)
    said = f" · {skipped} batches skipped (no signal)" if skipped else ""
    refilled = sum(p.groups_replaced for p in progresses)
    said += f" · refilled {refilled}" if refilled else ""
    each = " | ".join(f"{p.policy}: {p.policy_line()}" for p in progresses)
    prompt, cached = sum(p.prompt_tokens for p in progresses), sum(p.cached_tokens for p in progresses)
    cache = f" · cache {cached / prompt:.0%}" if prompt else ""
    return f"{each} · {first.episodes} episodes{said}{cache}{first.failed()}"
