"""Which episodes the next training step consumes. Pure.

Contract:
- Only whole groups are taken: a group is ready when all `group_size` of its episodes are recorded (finished,
  or abandoned: an abandoned episode is consumed with its group but never trained).
- Groups already consumed by an earlier step are never taken again; the oldest ready groups go first, at most
  `groups_per_batch` of them. Nothing ready → an empty selection (the step waits).
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
    for record in records:
        members.setdefault(record.group, set()).add(record.episode)
    ready = [g for g, episodes in members.items() if len(episodes) >= group_size and g not in consumed]
    return sorted(ready)[:groups_per_batch]
