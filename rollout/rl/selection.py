"""Which episodes the next training step consumes. Pure.

Contract:
- Only whole groups are taken: a group is ready when all `group_size` of its episodes are recorded (finished,
  or abandoned: an abandoned episode is consumed with its group but never trained). A group none of whose
  episodes finished (an environment's bug failed them all) has nothing to train on: it is never taken, so no
  step is spent on it (and the episode supply does not count it against its allowance).
- Groups already consumed by an earlier step are never taken again; the oldest ready groups go first.
- A batch is whole: exactly `groups_per_batch` groups, or an empty selection while fewer are ready (the step
  waits). Every step trains on the same amount of data, whatever the run's max_lag, so steps compare.
- Refill (`select_groups` with `refill_max`, DAPO's dynamic sampling): a group carries signal when, for one of
  the trained agents, the rewards of its finished episodes are not all equal (what `group_advantages` trains;
  the episodes' records hold the rewards, so no turn is read). Walking the ready groups oldest first, signal
  groups are kept until `groups_per_batch`; a tied group met on the way is consumed as replaced (never
  trained, and a fresh group takes its place) while fewer than `refill_max` were, and kept (to be skipped for
  no signal, as without refill) after that. The batch is whole once it keeps `groups_per_batch` groups;
  until then the step waits, and `set_aside` says how many tied groups it has replaced so far. So a step
  draws at most `groups_per_batch + refill_max` groups, and one whose every group ties is skipped as before.
  Without `refill_max` (refill off) it is `ready_groups`. Same records, same selection: a retried step agrees.
- `supply_allowance`: how many groups a run may have started, given the steps trained so far, max_lag and the
  groups replaced by refill (the episode supply's side of the staleness bound; admission is the turn's side).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rollout.rl.advantages import group_advantages


@dataclass(frozen=True)
class EpisodeRecordView:
    episode: str
    group: int
    finished: bool
    # By agent: the trained agents' rewards (a finished episode's; what refill judges a group's signal by).
    rewards: Mapping[str, float] = field(default_factory=dict[str, float])


@dataclass(frozen=True)
class Selection:
    """A step's groups: those it trains (`groups`, oldest first) and the tied ones it consumed without
    training (`replaced`), or, while the batch is not whole (`groups` empty), the tied groups it has set
    aside."""

    groups: list[int]
    replaced: list[int] = field(default_factory=list[int])

    @property
    def whole(self) -> bool:
        return bool(self.groups)

    @property
    def set_aside(self) -> int:
        """Tied groups replaced (by a whole batch), or set aside so far (by a step still waiting)."""
        return len(self.replaced)


def _ready(
    records: Iterable[EpisodeRecordView], group_size: int, consumed: set[int]
) -> dict[int, list[EpisodeRecordView]]:
    """The ready groups' records, by group: whole, not consumed, with an episode that finished."""
    members: dict[int, dict[str, EpisodeRecordView]] = {}
    for record in records:
        members.setdefault(record.group, {})[record.episode] = record
    return {
        g: list(episodes.values())
        for g, episodes in sorted(members.items())
        if len(episodes) >= group_size and g not in consumed and any(r.finished for r in episodes.values())
    }


def ready_groups(
    records: Iterable[EpisodeRecordView], *, group_size: int, consumed: set[int], groups_per_batch: int
) -> list[int]:
    ready = list(_ready(records, group_size, consumed))
    return ready[:groups_per_batch] if len(ready) >= groups_per_batch else []


def carries_signal(records: Iterable[EpisodeRecordView]) -> bool:
    """Whether a group's finished episodes give some trained agent rewards that are not all equal (what
    `group_advantages` needs to train it)."""
    by_agent: dict[str, list[float]] = {}
    for record in sorted(records, key=lambda r: r.episode):
        if record.finished:
            for agent, reward in record.rewards.items():
                by_agent.setdefault(agent, []).append(reward)
    return any(group_advantages(rewards) is not None for rewards in by_agent.values())


def select_groups(
    records: Iterable[EpisodeRecordView],
    *,
    group_size: int,
    consumed: set[int],
    groups_per_batch: int,
    refill_max: int | None = None,
) -> Selection:
    """The groups of the next step (see the module's contract); `refill_max` None: refill off."""
    ready = _ready(records, group_size, consumed)
    if refill_max is None:
        chosen = list(ready)[:groups_per_batch]
        return Selection(chosen if len(chosen) >= groups_per_batch else [])
    kept: list[int] = []
    replaced: list[int] = []
    for group, members in ready.items():
        if len(kept) >= groups_per_batch:
            break
        if carries_signal(members) or len(replaced) >= refill_max:
            kept.append(group)
        else:
            replaced.append(group)
    return Selection(kept if len(kept) >= groups_per_batch else [], replaced)


def supply_allowance(steps_trained: int, max_lag: int, groups_per_batch: int, replaced: int = 0) -> int:
    """Groups a training run may have started: a group started now is trained by step `steps_trained + max_lag
    + 1` at the latest, so its policy is at most `max_lag` checkpoints older than the one that trains on it.
    Each tied group refill replaced (or a waiting step set aside) lets one more start, in its place.

    With max_lag 0 this is a synchronous loop: one batch of groups plays, is trained on, and the next batch
    starts once its checkpoint exists (admission then holds its turns until an engine serves it).
    """
    return (steps_trained + max_lag + 1) * groups_per_batch + replaced
