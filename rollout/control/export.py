"""`rollout run export`: a run's steps and episodes as files any other tool reads (pandas, DuckDB, a
notebook, a tracker of one's own).

Contract:
- `export_run(settings, run, directory, file_format)` (blocking: it runs its own event loop) writes two
  files into `directory` (made if missing):
  `steps.FORMAT`, one row per complete step of each trained policy (rollout.tracking.step_metrics'
  `StepMetrics`, field for field), and `episodes.FORMAT`, one row per episode recorded for good (finished,
  or failed as a whole: run, episode, group, finished, environment, rewards and turns by agent, the failure's
  kind and reason). Rows are in step order, then in the order the ledger recorded the episodes.
- `jsonl`: one JSON object per line, nested values as JSON. `parquet` (needs pyarrow): one column per field;
  a field holding a mapping (`failures`, `extra`, `rewards`, `turns`) is a JSON string, so every file has
  the same columns whatever its rows hold.
- Everything comes from the ledger alone, read once: export a finished run, or a playing one as it stands.
  A run the ledger does not hold is `NotFound`; another format, or parquet without pyarrow, is a
  `ControlError` saying what to do. Files are written whole (to a temporary name, then renamed), so a
  reader never sees half of one.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rollout.control.connections import ledger_session
from rollout.control.errors import ControlError, NotFound

if TYPE_CHECKING:
    from rollout.config import Settings

type ExportFormat = Literal["jsonl", "parquet"]
FORMATS: tuple[ExportFormat, ...] = ("jsonl", "parquet")


@dataclass(frozen=True)
class Exported:
    """What `export_run` wrote: each file and its row count."""

    steps: Path
    step_rows: int
    episodes: Path
    episode_rows: int


def export_run(settings: Settings, run: str, directory: Path, file_format: str) -> Exported:
    if file_format not in FORMATS:
        raise ControlError(
            f"no export format {file_format!r}: choose one of {', '.join(FORMATS)}", usage=True
        )
    chosen: ExportFormat = "jsonl" if file_format == "jsonl" else "parquet"
    steps, episodes = asyncio.run(_read(settings, run))
    directory.mkdir(parents=True, exist_ok=True)
    return Exported(
        steps=_write(directory / f"steps.{chosen}", steps, chosen),
        step_rows=len(steps),
        episodes=_write(directory / f"episodes.{chosen}", episodes, chosen),
        episode_rows=len(episodes),
    )


async def _read(settings: Settings, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's step rows (in step order) and episode rows, from the ledger."""
    from rollout.control.runs import NO_SUCH_RUN
    from rollout.ledger.payloads import episode_ended
    from rollout.ledger.queries import find_run, read_all, run_progress
    from rollout.ledger.streams import run_episodes_stream
    from rollout.tracking.step_metrics import step_metrics

    async with ledger_session(settings) as ledger:
        if await find_run(ledger, run) is None:
            raise NotFound(NO_SUCH_RUN.format(run=run))
        steps: list[dict[str, Any]] = []
        for ledger_policy in (await run_progress(ledger, run)).policies:
            name = ledger_policy.removeprefix(f"{run}/")
            steps += [record.to_json() for record in await step_metrics(ledger, run, name)]
        episodes = [
            {
                "run": ended.run,
                "episode": ended.episode,
                "group": ended.group,
                "finished": ended.finished,
                "environment": ended.environment,
                "rewards": ended.rewards,
                "turns": ended.turns,
                "failure_kind": ended.failure.kind if ended.failure else None,
                "failure_reason": ended.failure.reason if ended.failure else ended.error,
                "recorded_at": event.recorded_at.isoformat(),
            }
            for event in await read_all(ledger, run_episodes_stream(run))
            if (ended := episode_ended(event)) is not None
        ]
    steps.sort(key=lambda row: (row["step"], row["policy"]))
    return steps, episodes


def _write(path: Path, rows: Sequence[dict[str, Any]], file_format: ExportFormat) -> Path:
    partial = path.with_name(f".{path.name}.partial")
    if file_format == "jsonl":
        partial.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        _write_parquet(partial, rows)
    os.replace(partial, path)
    return path


def _write_parquet(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ControlError(
            "parquet needs pyarrow, which this environment lacks: `pip install 'rollout[export]'` (or `uv add "
            "pyarrow`) adds it; `--format jsonl` needs nothing more"
        ) from error
    flat = [{k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()} for row in rows]
    pq.write_table(pa.Table.from_pylist(flat), path)
