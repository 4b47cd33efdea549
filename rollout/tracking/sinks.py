"""A tracking backend as the feed sees it: open or resume the run's run, say what it holds, log one entry.

Contract:
- A `Sink` is one backend's run for one rollout run. `open()` creates it, or finds and continues the one an
  earlier feed made (by the rollout run's id, so a restarted feed, another runner or a resumed stack logs into
  the same run), and logs the run's config. `positions(streams)` reads back from the backend itself the newest
  step it holds of each stream (those named, and any it knows of): the backend is the one place that cannot
  be behind what it holds, so a feed killed between a log and anything it would record elsewhere neither
  repeats nor skips.
  `log(entries)` writes up to `batch` entries in one call to the backend, all of them or nothing (W&B and
  MLflow take one entry a call; a trace backend a poll's traces in one export). `close(final)` lets go of
  the run; `final`: the rollout run is over and so is the backend's (a feed stopped mid-run leaves it open).
- Every method blocks (the libraries are synchronous); the feed runs them off its event loop with a time
  bound. A method raises on any refusal; the feed keeps the sink's state and tries again later.
- Names on the backend: a stream's numbers are `STREAM/NAME` (`train/loss`, `eval/smoke/arithmetic/score`);
  each stream's axis is `STREAM/step`, which is also how `positions()` reads it back.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Protocol

from rollout.tracking.entries import Entry


class Sink(Protocol):
    backend: str  # wandb | mlflow | otlp
    setting: str  # what a person changes to point it elsewhere
    batch: int  # the most entries one `log` call takes

    def open(self) -> None: ...

    def positions(self, streams: set[str]) -> dict[str, int]: ...

    def log(self, entries: Sequence[Entry]) -> None: ...

    def close(self, final: bool) -> None: ...


def run_slug(run: str) -> str:
    """A rollout run's id as a name a backend (or a file system) takes: its own characters where allowed, made
    unique by a hash."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", run)[:48]
    return f"{safe}-{hashlib.sha256(run.encode()).hexdigest()[:8]}"


def axis(stream: str) -> str:
    return f"{stream}/step"


def metric_names(entry: Entry) -> dict[str, float]:
    """The entry's numbers under their names on a backend, its axis included."""
    return {
        axis(entry.stream): float(entry.step),
        **{f"{entry.stream}/{k}": v for k, v in entry.values.items()},
    }


def newest_steps(rows: list[dict[str, object]]) -> dict[str, int]:
    """Each stream's newest step in rows of logged names (history rows, a summary): every `STREAM/step`."""
    held: dict[str, int] = {}
    for row in rows:
        for name, value in row.items():
            if name.endswith("/step") and isinstance(value, int | float) and not isinstance(value, bool):
                stream = name.removesuffix("/step")
                held[stream] = max(held.get(stream, int(value)), int(value))
    return held
