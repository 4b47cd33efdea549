"""A tracking feed as its own process, for tests that kill it.

`python -m tests.tracking_feeder LEDGER_URL RUN WANDB_DIR MLFLOW_URI PAUSE_S` feeds run RUN's entries to W&B
(offline, under WANDB_DIR) and MLflow (MLFLOW_URI), printing `logged BACKEND STREAM STEP` once a backend has
logged an entry, then pausing PAUSE_S."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rollout.ledger import Ledger
from rollout.tracking.entries import Entry, run_entries
from rollout.tracking.feed import Feed
from rollout.tracking.mlflow_sink import MlflowSink
from rollout.tracking.sinks import Sink
from rollout.tracking.wandb_sink import WandbSink
from rollout.workflows.tracking_types import MlflowSpec, TrackingInput, WandbSpec


class Slow:
    """A sink that says what it logged and then takes its time (a window to be killed in)."""

    def __init__(self, sink: WandbSink | MlflowSink, pause_s: float) -> None:
        self.sink, self.pause_s = sink, pause_s
        self.backend, self.setting, self.batch = sink.backend, sink.setting, sink.batch

    def open(self) -> None:
        self.sink.open()

    def positions(self, streams: set[str]) -> dict[str, int]:
        return self.sink.positions(streams)

    def log(self, entries: Sequence[Entry]) -> None:
        self.sink.log(entries)
        for entry in entries:
            print(f"logged {self.backend} {entry.stream} {entry.step}", flush=True)
        time.sleep(self.pause_s)

    def close(self, final: bool) -> None:
        self.sink.close(final)


async def main(ledger_url: str, run: str, wandb_dir: Path, mlflow_uri: str, pause_s: float) -> None:
    given = TrackingInput(
        run,
        policies=["default"],
        wandb=WandbSpec(project="killed", offline=True),
        mlflow=MlflowSpec(tracking_uri=mlflow_uri, experiment="killed"),
        samples_every=1,
        samples=1,
    )
    assert given.wandb is not None and given.mlflow is not None
    wandb, mlflow = given.wandb, given.mlflow

    def slow_wandb() -> Sink:
        return Slow(WandbSink(run, wandb, wandb_dir, {}), pause_s)

    def slow_mlflow() -> Sink:
        return Slow(MlflowSink(run, mlflow, wandb_dir, {}), pause_s)

    feed = Feed(run, [("wandb", WandbSink.setting, slow_wandb), ("mlflow", MlflowSink.setting, slow_mlflow)])
    async with await Ledger.connect(ledger_url) as ledger:
        entries = await run_entries(ledger, given, given.policies)
    await feed.push(entries)
    assert all(b.ok for b in feed.state().backends), feed.state()
    await feed.close()
    print(f"done {len(entries)}", flush=True)


if __name__ == "__main__":
    url, run, directory, uri, pause = sys.argv[1:6]
    asyncio.run(main(url, run, Path(directory), uri, float(pause)))
