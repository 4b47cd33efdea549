"""Self-play pins: a seat's `checkpoint` named relative to its own policy's lineage in the run.

Contract:
- `parse_pin(text)` reads a seat's `checkpoint`: `latest` (the newest checkpoint of the seat's policy),
  `latest-K` (K checkpoints behind it, K >= 1), `sample` (one drawn from the last `SAMPLE_WINDOW`) or
  `sample-N` (from the last N, N >= 1) give a `RelativePin`; any other text is a fixed checkpoint name and
  gives None. Text that starts like a relative pin and is not one (`latest-0x`, `latest-0`, `sample-`) raises
  `ValueError` saying what is allowed, so a typo never becomes a checkpoint name that nothing serves.
- `RelativePin.choose(lineage, seed)` picks from `lineage` (the policy's checkpoint names, oldest first;
  the base model is not in it) and returns a `PinChoice`: the checkpoint and, when the lineage is too short
  for the pin (`latest-1` before step 2, anything before step 1), the fallback it took and why. A pin that
  reaches behind the oldest checkpoint takes the oldest; an empty lineage gives the base model. `sample`
  draws uniformly with `random.Random(seed)`, so one seed (an episode's id) always draws the same one.
- Pure and standard library only: workflow code and `rollout.environment` import it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

LATEST = "latest"
SAMPLE = "sample"
BASE_CHECKPOINT = "base"  # rollout.records.serving.BASE_CHECKPOINT (not imported: it brings the blob store)
SAMPLE_WINDOW = 8  # `sample` draws from this many of the newest checkpoints

_PIN = re.compile(r"(latest|sample)(?:-([1-9][0-9]*))?")
_SYNTAX = "latest, latest-K (K >= 1 checkpoints behind), sample or sample-N (from the newest N >= 1)"


@dataclass(frozen=True)
class PinChoice:
    """The checkpoint a relative pin resolved to, and why it fell back when the lineage was too short."""

    checkpoint: str
    fallback: str | None = None


@dataclass(frozen=True)
class RelativePin:
    """`latest-behind` (behind 0: the newest), or, with `window`, a draw among the newest `window`."""

    text: str
    behind: int = 0
    window: int | None = None

    def choose(self, lineage: list[str], seed: str) -> PinChoice:
        if not lineage:
            return PinChoice(
                BASE_CHECKPOINT, f"{self.text}: no checkpoint of the policy yet, played the base"
            )
        if self.window is not None:
            pool = lineage[-self.window :]
            return PinChoice(random.Random(f"{self.text}/{seed}").choice(pool))
        if self.behind < len(lineage):
            return PinChoice(lineage[-1 - self.behind])
        return PinChoice(
            lineage[0],
            f"{self.text}: the policy has {len(lineage)} checkpoint(s), played the oldest",
        )


def is_relative(checkpoint: str | None) -> bool:
    """Does a seat's `checkpoint` name a relative pin (and not a fixed checkpoint)?"""
    return checkpoint is not None and checkpoint.startswith((LATEST, SAMPLE))


def parse_pin(text: str) -> RelativePin | None:
    """The relative pin `text` names; None for a fixed checkpoint name, `ValueError` for a malformed pin."""
    if not is_relative(text):
        return None
    found = _PIN.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r} is no checkpoint pin: {_SYNTAX}")
    kind, number = found.group(1), found.group(2)
    if kind == LATEST:
        return RelativePin(text, behind=int(number or 0))
    return RelativePin(text, window=int(number) if number else SAMPLE_WINDOW)
