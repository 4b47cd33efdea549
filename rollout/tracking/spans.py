"""A span of a run's trace as rollout builds it from the ledger, and the ids that name it.

Contract:
- A `Span` is one timed piece of work: its trace, its own id, its parent's (None for a trace's root), when
  it started and ended (the ledger's clock), its attributes (OpenTelemetry's value types only) and, for work
  that failed, why.
- Ids are derived, never drawn: `episode_trace_id(run, episode)` and `step_trace_id(run, policy, step)` are
  functions of the names alone (the first 16 bytes of a SHA-256, as 32 hex digits), and `span_id(trace,
  path)` of the trace and the span's path in it (8 bytes, 16 hex digits). So a feed that builds a trace again
  (after a restart, in another process) gives every span the id it had, a receiver keyed by span id keeps
  one of each, and the dashboard names an episode's trace without asking anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

type AttributeValue = str | int | float | bool


def _digest(*parts: str, size: int) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[: 2 * size]


def episode_trace_id(run: str, episode: str) -> str:
    """The trace id of an episode's spans (episode → seat → turn)."""
    return _digest("rollout-episode", run, episode, size=16)


def step_trace_id(run: str, policy: str, step: int) -> str:
    """The trace id of a training step's spans (step → train, bridge, serving) of `policy` (its name in the
    environment)."""
    return _digest("rollout-step", run, policy, str(step), size=16)


def span_id(trace: str, path: str) -> str:
    """The id of the span at `path` (`episode`, `seat/AGENT`, `seat/AGENT/turn/3`, …) in trace `trace`."""
    return _digest(trace, path, size=8)


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str | None  # None: the trace's root
    start: datetime
    end: datetime
    attributes: dict[str, AttributeValue] = field(default_factory=dict[str, AttributeValue])
    error: str | None = None  # the work failed: why, in one line


def span(
    trace: str,
    path: str,
    name: str,
    start: datetime,
    end: datetime,
    *,
    parent: str | None,
    attributes: Mapping[str, AttributeValue | None] | None = None,
    error: str | None = None,
) -> Span:
    """The span at `path` in `trace`, a child of the span at path `parent` (None: the root). An attribute
    given as None is left out; an end before the start is taken as the start (clocks of two writers)."""
    return Span(
        name=name,
        trace_id=trace,
        span_id=span_id(trace, path),
        parent_id=None if parent is None else span_id(trace, parent),
        start=start,
        end=max(start, end),
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
        error=error,
    )
