"""Advantages for a group of episodes of one task (one seat's rewards), as plug-ins. Pure Python, no I/O.

Contract:
- An advantage method is a function from a group's rewards to one advantage per episode, in order
  (`AdvantageFn`). `BUILT_IN` names the built-in ones; `advantage_from(spec)` is a built-in name or a
  researcher's own function at `package.module:attribute` (imported as environments are, rollout.references),
  or raises `AdvantageError` saying what to set.
- `group_advantages(rewards_G, method)` applies a method, or returns None when the group carries no signal
  (every reward equal, within `tolerance`, or a group of one episode): such a group is skipped and counted,
  never trained on with zero advantages. Rewards must be finite; a method that answers with another count of
  advantages, or a non-finite one, raises `AdvantageError`.
- `group_norm` (GRPO): `(R_i − mean R) / (std R + eps)`, with the population standard deviation.
- `leave_one_out` (RLOO): `R_i − mean_{j≠i} R_j`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

type AdvantageFn = Callable[[Sequence[float]], Sequence[float]]


class AdvantageError(ValueError):
    """An advantage method cannot be found, or answered what no advantage is; the message says what to
    set."""


def group_norm(rewards_G: Sequence[float], *, eps: float = 1e-6) -> list[float]:
    """GRPO's: each reward's distance from the group's mean, in the group's standard deviations."""
    mean = sum(rewards_G) / len(rewards_G)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards_G) / len(rewards_G))
    return [(r - mean) / (std + eps) for r in rewards_G]


def leave_one_out(rewards_G: Sequence[float]) -> list[float]:
    """RLOO's: each reward less the mean of the others'."""
    total, count = sum(rewards_G), len(rewards_G)
    return [r - (total - r) / (count - 1) for r in rewards_G]


BUILT_IN: dict[str, AdvantageFn] = {"group_norm": group_norm, "leave_one_out": leave_one_out}


def advantage_from(spec: str) -> AdvantageFn:
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    if ":" not in spec:
        raise AdvantageError(
            f"no advantage method {spec!r}: name a built-in one ({', '.join(BUILT_IN)}) or your own function as "
            "package.module:attribute"
        )
    from rollout.references import ReferenceLoadError, import_reference

    try:
        found = import_reference(spec, "advantage reference")
    except ReferenceLoadError as error:
        raise AdvantageError(str(error)) from None
    if not callable(found):
        raise AdvantageError(
            f"{spec} is a {type(found).__name__}, not a function from a group's rewards to their advantages"
        )
    return cast("AdvantageFn", found)  # what it answers is checked where it is applied


def group_advantages(
    rewards_G: Sequence[float], method: str | AdvantageFn = "group_norm", *, tolerance: float = 1e-9
) -> list[float] | None:
    if any(not math.isfinite(r) for r in rewards_G):
        raise ValueError(f"rewards must be finite numbers, got {list(rewards_G)}")
    count = len(rewards_G)
    if count < 2 or max(rewards_G) - min(rewards_G) <= tolerance:
        return None
    apply = advantage_from(method) if isinstance(method, str) else method
    advantages = [float(a) for a in apply(list(rewards_G))]
    if len(advantages) != count or not all(math.isfinite(a) for a in advantages):
        raise AdvantageError(
            f"advantage method {method!r} answered {advantages} for {count} rewards: it must give one finite "
            "advantage per episode"
        )
    return advantages
