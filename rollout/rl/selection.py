"""Which episodes the next training step consumes. Pure.

Contract:
- Only whole groups are taken: a group is ready when all `group_size` of its episodes are recorded (finished,
  or abandoned: an abandoned episode is consumed with its group but never trained). A group none of whose
  episodes finished (an environment's bug failed them all) has nothing to train on: it is never taken, so no
  step is spent on it (and the episode supply does not count it against its allowance).
- Groups already consumed by an earlier step are never taken again; the oldest ready groups go first.
- A batch is whole: exactly `groups_per_batch` groups, or an empty selection while fewer are ready (the step
  waits). Every step trains on the same amount of data, whatever the run's max_lag, so steps compare.
- `supply_allowance`: how many groups a run may have started, given the steps trained so far and max_lag (the
  episode supply's side of the staleness bound; admission is the turn's side).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class EpisodeRecordView:
    episode: str
    group: int
    finished: bool


def ready_groups(
    records: Iterable[EpisodeRecordView], *, group_size: int, consumed: set[int], groups_per_batch: int
) -> list[int]:
    members: dict[int, set[str]] = {}
    trainable: set[int] = set()
    for record in records:
        members.setdefault(record.group, set()).add(record.episode)
        if record.finished:
            trainable.add(record.group)
    ready = [
        g
        for g, episodes in members.items()
        if len(episodes) >= group_size and g not in consumed and g in trainable
    ]
    return sorted(ready)[:groups_per_batch] if len(ready) >= groups_per_batch else []


def supply_allowance(steps_trained: int, max_lag: int, groups_per_batch: int) -> int:
    """Groups a training run may have started: a group started now is trained by step `steps_trained + max_lag
    + 1` at the latest, so its policy is at most `max_lag` checkpoints older than the one that trains on it.

    With max_lag 0 this is a synchronous loop: one batch of groups plays, is trained on, and the next batch
    starts once its checkpoint exists (admission then holds its turns until an engine serves it).
    """
    return (steps_trained + max_lag + 1) * groups_per_batch
