"""Assembling a training batch: finished episodes → advantages per agent → segments to train. Pure.

Contract:
- Episodes are grouped by (task group, agent): a group's episodes played the same task, and each agent seat
  has its own reward and advantage (multi-agent episodes train each seat against its own group). Seats that
  share a policy train together in one batch; `policy` selects them.
- A group whose rewards carry no signal (all equal, or a single episode) is skipped and counted, never trained
  with zero advantages.
- Every sampled token of an agent's segments gets the agent's advantage.
- The batch lists exactly the episodes it consumed (`episodes`), which is what `BatchAssembled` records, so a
  retried step trains on the same data and no episode is used twice.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from rollout.rl.advantages import group_advantages
from rollout.rl.segments import TrainingSegment


@dataclass(frozen=True)
class AgentEpisode:
    """One agent's part of a finished episode: its reward and its training segments."""

    episode: str
    group: int
    agent: str
    policy: str
    reward: float
    segments: tuple[TrainingSegment, ...]


@dataclass(frozen=True)
class WeightedSegment:
    episode: str
    agent: str
    advantage: float
    segment: TrainingSegment


@dataclass(frozen=True)
class Batch:
    policy: str
    segments: tuple[WeightedSegment, ...]
    episodes: tuple[str, ...]  # every episode consumed, trained or skipped
    skipped_groups: int
    reward_mean: float
    reward_std: float
    sampled_tokens: int
    metrics: dict[str, float] = field(default_factory=dict[str, float])

    @classmethod
    def of(cls, policy: str, segments: Sequence[WeightedSegment]) -> Batch:
        """A batch of segments already weighted (a benchmark's, a test's): the episodes they come from, no
        group skipped, rewards not known (0)."""
        return cls(
            policy=policy,
            segments=tuple(segments),
            episodes=tuple(sorted({w.episode for w in segments})),
            skipped_groups=0,
            reward_mean=0.0,
            reward_std=0.0,
            sampled_tokens=sum(w.segment.sampled_tokens for w in segments),
        )


def assemble_batch(played: Sequence[AgentEpisode], policy: str, method: str = "group_norm") -> Batch:
    mine = [p for p in played if p.policy == policy]
    groups: dict[tuple[int, str], list[AgentEpisode]] = {}
    for part in mine:
        groups.setdefault((part.group, part.agent), []).append(part)
    weighted: list[WeightedSegment] = []
    skipped = 0
    for key in sorted(groups):
        members = sorted(groups[key], key=lambda p: p.episode)
        advantages = group_advantages([m.reward for m in members], method)
        if advantages is None:
            skipped += 1
            continue
        for member, advantage in zip(members, advantages, strict=True):
            weighted += [
                WeightedSegment(episode=member.episode, agent=member.agent, advantage=advantage, segment=s)
                for s in member.segments
                if s.sampled_tokens
            ]
    rewards = [p.reward for p in mine]
    tokens = sum(w.segment.sampled_tokens for w in weighted)
    return Batch(
        policy=policy,
        segments=tuple(weighted),
        episodes=tuple(sorted({p.episode for p in mine})),
        skipped_groups=skipped,
        reward_mean=statistics.fmean(rewards) if rewards else 0.0,
        reward_std=statistics.pstdev(rewards) if rewards else 0.0,
        sampled_tokens=tokens,
        metrics={
            "groups": float(len(groups)),
            "skipped_groups": float(skipped),
            "segments": float(len(weighted)),
        },
    )
