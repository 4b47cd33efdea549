"""A curve in a line of text: `sparkline(values)` draws numbers as block characters, lowest to highest."""

from __future__ import annotations

from collections.abc import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int = 30) -> str:
    """The newest `width` of `values` as blocks scaled between their least and greatest (a space where a value
    is missing; a flat line where all are equal)."""
    shown = list(values)[-width:]
    present = [v for v in shown if v is not None]
    if not present:
        return ""
    low, high = min(present), max(present)
    span = high - low
    top = len(BLOCKS) - 1
    return "".join(
        " " if v is None else BLOCKS[round((v - low) / span * top) if span else top // 2] for v in shown
    )
