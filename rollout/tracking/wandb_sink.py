"""The W&B backend: one W&B run per rollout run, online or offline.

Contract:
- The W&B run's id is derived from the rollout run's id (`wandb_run_id`), so every feed of the run, on any
  runner and after any restart, logs into the same W&B run (`resume="allow"` online). Offline, each feed
  writes a directory of its own under the runner's `DIR/wandb` (W&B's offline runs do not resume); `wandb
  sync DIR/wandb/offline-run-*-ID` uploads them into the one run, in order.
- `positions()` reads the run's `.wandb` logs on this machine (rollout.tracking.wandb_files: online runs write
  one too) and, online, the resumed run's summary: the newest `STREAM/step` of each stream.
- Each entry is one `run.log` call, committed: its numbers, its axis `STREAM/step` (declared with
  `define_metric`, so W&B plots each stream against its own steps), a sample table as a `wandb.Table`. The
  run's config is the rollout run's settings. The key is W&B's own (`WANDB_API_KEY`, `wandb login`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.tracking.entries import Entry
from rollout.tracking.sinks import axis, metric_names, newest_steps, run_slug
from rollout.tracking.wandb_files import history
from rollout.workflows.tracking_types import WandbSpec

INIT_TIMEOUT_S = 60.0


def wandb_run_id(run: str) -> str:
    """A W&B run id for a rollout run: its own characters where W&B allows them, made unique by a hash."""
    return run_slug(run)


class WandbSink:
    backend = "wandb"
    setting = "tracking.wandb.project"
    batch = 1  # one committed `run.log` an entry

    def __init__(self, run: str, spec: WandbSpec, directory: Path, config: dict[str, str]) -> None:
        self.run = run
        self.spec = spec
        self.directory = directory
        self.config = config
        self.run_id = wandb_run_id(run)
        self._run: Any = None
        self._axes: set[str] = set()

    def open(self) -> None:
        import wandb

        self.directory.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        self._run = wandb.init(
            id=self.run_id,
            project=spec.project,
            entity=spec.entity,
            name=spec.name or self.run,
            group=spec.group,
            tags=list(spec.tags) or None,
            config={"rollout_run": self.run, **self.config},
            dir=str(self.directory),
            mode="offline" if spec.offline else "online",
            resume=None if spec.offline else "allow",
            reinit="create_new",
            settings=wandb.Settings(
                silent=True,
                console="off",
                init_timeout=INIT_TIMEOUT_S,
                x_disable_stats=True,
                x_disable_meta=True,
            ),
        )

    def positions(self, streams: set[str]) -> dict[str, int]:
        rows: list[dict[str, object]] = list(history(self.directory, self.run_id))
        if self._run is not None and not self.spec.offline:
            rows.append(dict(self._run.summary))
        return newest_steps(rows)

    def log(self, entries: Sequence[Entry]) -> None:
        import wandb

        [entry] = entries
        run = self._run
        assert run is not None, "open() first"
        if entry.stream not in self._axes:
            run.define_metric(axis(entry.stream))
            run.define_metric(f"{entry.stream}/*", step_metric=axis(entry.stream))
            self._axes.add(entry.stream)
        row: dict[str, Any] = metric_names(entry)
        if entry.table is not None:
            rows: Any = entry.table.rows  # wandb's stubs want its own row type: a list of lists is one
            row[f"{entry.stream}/table"] = wandb.Table(columns=list(entry.table.columns), data=rows)
        run.log(row, commit=True)

    def close(self, final: bool) -> None:
        if self._run is not None:
            # W&B resumes a finished run when the next feed opens it: stopped mid-run or over, it is finished.
            self._run.finish()
            self._run = None
