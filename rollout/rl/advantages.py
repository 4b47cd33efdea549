"""Advantages for a group of episodes of one task (one seat's rewards). Pure Python, no I/O.

Contract:
- `AdvantageKind` names the methods; `group_advantages(rewards_G, method)` returns one advantage per episode,
  in order, or None when the group carries no signal (every reward equal, within `tolerance`): such a group is
  skipped and counted, never trained on with zero advantages.
- `group_norm` (GRPO): `(R_i − mean R) / (std R + eps)`, with the population standard deviation.
- `leave_one_out` (RLOO): `R_i − mean_{j≠i} R_j`; needs at least two episodes.
- Rewards must be finite; a group of one episode has no signal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum


class AdvantageKind(StrEnum):
    """How a group's rewards become advantages: the one spelling of the choice, from `trainer.advantage`
    through the workflows' inputs to the math."""

    group_norm = "group_norm"  # GRPO
    leave_one_out = "leave_one_out"  # RLOO


def group_advantages(
    rewards_G: Sequence[float],
    method: AdvantageKind = AdvantageKind.group_norm,
    *,
    eps: float = 1e-6,
    tolerance: float = 1e-9,
) -> list[float] | None:
    if any(not math.isfinite(r) for r in rewards_G):
        raise ValueError(f"rewards must be finite numbers, got {list(rewards_G)}")
    count = len(rewards_G)
    if count < 2 or max(rewards_G) - min(rewards_G) <= tolerance:
        return None
    mean = sum(rewards_G) / count
    if method == "group_norm":
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards_G) / count)
        return [(r - mean) / (std + eps) for r in rewards_G]
    if method == "leave_one_out":
        total = sum(rewards_G)
        return [r - (total - r) / (count - 1) for r in rewards_G]
    raise ValueError(f"advantage method must be group_norm or leave_one_out, not {method!r}")
