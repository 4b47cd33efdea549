"""What tracking costs the turns: turns/s and p50 through the gateway with a run's feed to W&B and MLflow, and
its traces to an OTLP collector, beside it, against none, in one run.

Everything is real and local: the embedded stack (Postgres, Temporal), a scripted engine
(benchmarks.scripted_backend) behind `rollout gateway` (which records every turn in Postgres before it
answers), and the feed as a runner runs it (rollout.tracking's `RunReader` and `Feed`, W&B offline and
MLflow's sqlite store, and `TraceReader` exporting each episode's and step's spans through OpenTelemetry's
OTLP/HTTP exporter to a loopback receiver in the feed's process: rollout_testing.otlp_receiver) in a process
of its own, polling every 2 s. The run it follows is seeded with `STEPS` steps over `EPISODES` episodes of 4
turns; in every phase a writer records a new step (its batch and checkpoint) and the `EPISODES_PER_STEP`
episodes it trains on every 2 s, so the feed reads the run's steps again, logs a point and exports new traces
as it would while training.

Phases: catch-up (the feed's first, which exports the seeded run's traces and points: measured on its own),
then off, on, off, on at concurrency 16; reported: turns/s and p50 of each, the change of on over off
(target, issue 51: turns/s within 5%), the traces each feed exported, and the feed's own time per poll (a
full read of the run's steps when one landed, and a poll when none did) and to build the traces of one
poll's episodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import (
    policy_checkpoints_stream,
    run_batches_stream,
    run_episodes_stream,
    seat_stream,
)
from rollout.stack.processes import terminate
from rollout.tracking.entries import RunReader
from rollout.tracking.feed import Feed
from rollout.tracking.traces import EVENTS_PER_READ, TraceReader
from rollout.workflows.tracking_types import MlflowSpec, OtlpSpec, TrackingInput, WandbSpec

STEPS, EPISODES = 200, 2000
EPISODES_PER_STEP = 10  # recorded with each new step: 5 episodes (20 turns) a second end and are traced
POLL_S = 2.0
CONCURRENCY = 16


def tracked(run: str, otlp: str = "http://127.0.0.1:1") -> TrackingInput:
    return TrackingInput(
        run,
        policies=["default"],
        wandb=WandbSpec("bench", offline=True),
        mlflow=MlflowSpec(experiment="bench"),
        otlp=OtlpSpec(otlp),
        samples_every=10,
        samples=4,
    )


def _batch(run: str, step: int, episodes: list[str]) -> NewEvent:
    return NewEvent(
        f"step/{step}",
        Kind.BATCH_ASSEMBLED,
        {
            "run": run,
            "policy": f"{run}/default",
            "step": step,
            "groups": list(range(len(episodes))),
            "episodes": episodes,
            "trained_episodes": episodes,
            "skipped_groups": 0,
            "sampled_tokens": 96 * len(episodes),
            "reward_mean": 0.5,
            "reward_std": 0.2,
        },
    )


async def seed(ledger: Ledger) -> str:
    """A run of `STEPS` trained steps: the dashboard benchmark's checkpoints and episodes, a batch a step."""
    from benchmarks.monitor import seed as seed_campaign

    run = await seed_campaign(ledger, runs=1, steps=STEPS, episodes=EPISODES)
    per_step = EPISODES // STEPS
    await ledger.append(
        run_batches_stream(run, f"{run}/default"),
        [
            _batch(run, step, [f"g{n:06d}-0" for n in range((step - 1) * per_step, step * per_step)])
            for step in range(1, STEPS + 1)
        ],
    )
    return run


async def write_steps(ledger_url: str, run: str, first: int, stop: asyncio.Event) -> int:
    """A new step every `POLL_S` until `stop`, and `EPISODES_PER_STEP` new episodes of 4 turns it trains on:
    what a training run records. Returns the next step."""
    from benchmarks.monitor import episode_events

    rng = random.Random(first)
    step = first
    async with await Ledger.connect(ledger_url) as ledger:
        while not stop.is_set():
            policy = f"{run}/default"
            ended, names = [], []
            for n in range(
                EPISODES + (step - STEPS - 1) * EPISODES_PER_STEP,
                EPISODES + (step - STEPS) * EPISODES_PER_STEP,
            ):
                seat, turns, finished = episode_events(run, n, step - 1, rng)
                await ledger.append(seat_stream(seat), turns)
                ended.append(finished)
                names.append(finished.payload["episode"])
            await ledger.append(run_episodes_stream(run), ended)
            await ledger.append(run_batches_stream(run, policy), [_batch(run, step, names)])
            name = f"{policy}-step{step:06d}"
            checkpoint = {
                "name": name,
                "policy": policy,
                "version": step,
                "step": step,
                "metrics": {"loss": 0.1},
            }
            await ledger.append(
                policy_checkpoints_stream(policy),
                [NewEvent(f"step/{step}", Kind.CHECKPOINT_CREATED, checkpoint)],
            )
            step += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
    return step


async def feed_forever(ledger_url: str, run: str, directory: Path) -> None:
    """The feed as a runner's activity runs it (rollout.activities.tracking), without Temporal, its collector
    a receiver in this process."""
    from rollout_testing.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    given = tracked(run, receiver.url)
    feed = Feed.of(given, directory)
    reader, tracer = RunReader(given), TraceReader(given)
    async with await Ledger.connect(ledger_url) as ledger:
        while True:
            held = feed.held("otlp")
            traced = [] if held is None else await tracer.read(ledger, held)
            await feed.push(await reader.read(ledger) + traced)
            print(json.dumps({b.backend: b.logged for b in feed.state().backends}), flush=True)
            await asyncio.sleep(POLL_S)


async def poll_times(ledger_url: str, run: str) -> dict[str, float]:
    """The feed's read per poll: a full read of the run's steps (one landed) and a poll when none did."""
    async with await Ledger.connect(ledger_url) as ledger:
        reader = RunReader(tracked(run))
        started = time.perf_counter()
        entries = await reader.read(ledger)
        full = time.perf_counter() - started
        idle = []
        for _ in range(5):
            started = time.perf_counter()
            await reader.read(ledger)
            idle.append(time.perf_counter() - started)
        started = time.perf_counter()
        traces = await TraceReader(tracked(run)).read(ledger, {"traces/steps": STEPS})
        traced = time.perf_counter() - started
    return {
        "entries": len(entries),
        "full_read_ms": 1000 * full,
        "idle_poll_ms": 1000 * statistics.median(idle),
        "trace_read_ms": 1000 * traced,
        "spans_per_read": sum(len(e.spans) for e in traces),
    }


def main(quick: bool = False) -> int:
    from benchmarks.gateway import _load, start_gateway
    from benchmarks.stack import bench_stack

    turns = 400 if quick else 12000  # full: about 12 s a phase, six polls of the feed
    processes: list[subprocess.Popen[bytes]] = []
    with (
        tempfile.TemporaryDirectory(prefix="rollout-bench-tracking-") as scratch,
        open(Path(scratch) / "servers.log", "wb") as log,
        bench_stack(Path(scratch)) as bench,
    ):
        overrides, settings = bench.overrides, bench.settings
        try:

            async def seeded() -> str:
                async with await Ledger.connect(settings.ledger_url) as ledger:
                    return await seed(ledger)

            run = asyncio.run(seeded())
            reads = asyncio.run(poll_times(settings.ledger_url, run))
            print(f"feed poll: {reads}", file=sys.stderr, flush=True)
            served = start_gateway(overrides, log, processes)
            url = f"{served.gateway}/v1/chat/completions"
            phases: list[tuple[str, dict[str, float]]] = []
            next_step = STEPS + 1
            for phase in ("catch-up", "off", "on", "off", "on"):
                feeder = None
                if phase != "off":
                    feeder = subprocess.Popen(
                        [sys.executable, "-m", "benchmarks.tracking", run, scratch],
                        env={**os.environ, "LEDGER_URL": settings.ledger_url},  # a password: never in argv
                        stdout=subprocess.PIPE,
                        stderr=log,
                    )
                    assert feeder.stdout is not None
                    feeder.stdout.readline()  # its backends are open and it holds the run: what training sees

                async def load(first: int) -> tuple[dict[str, float], int]:
                    stop = asyncio.Event()
                    writer = asyncio.create_task(write_steps(settings.ledger_url, run, first, stop))
                    measured = await _load(url, served.seats, CONCURRENCY, turns)
                    stop.set()
                    return measured, await writer

                measured, next_step = asyncio.run(load(next_step))
                if feeder is not None:
                    assert feeder.stdout is not None
                    terminate(feeder.pid)
                    said = feeder.stdout.read().decode().splitlines()
                    logged = json.loads(said[-1]) if said else {}
                    measured = {**measured, "traces_exported": float(logged.get("otlp", 0))}
                phases.append((phase, measured))
                print(
                    f"{phase:>8}: {measured['turns_per_s']:7.1f} turns/s  p50 {measured['p50_ms']:6.2f} ms",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for process in processes:
                terminate(process.pid)
    off = [m for phase, m in phases if phase == "off"]
    on = [m for phase, m in phases if phase == "on"]
    [catching_up] = [m for phase, m in phases if phase == "catch-up"]
    off_tps = statistics.mean(m["turns_per_s"] for m in off)
    on_tps = statistics.mean(m["turns_per_s"] for m in on)
    summary = {
        "benchmark": "tracking",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
        "steps_seeded": STEPS,
        "episodes_seeded": EPISODES,
        "concurrency": CONCURRENCY,
        "off_turns_per_s": round(off_tps, 1),
        "on_turns_per_s": round(on_tps, 1),
        "off_p50_ms": round(statistics.mean(m["p50_ms"] for m in off), 2),
        "on_p50_ms": round(statistics.mean(m["p50_ms"] for m in on), 2),
        "turns_per_s_change": round(on_tps / off_tps - 1, 4),
        "traces_exported_per_on_phase": [int(m["traces_exported"]) for m in on],
        "catch_up_turns_per_s": round(catching_up["turns_per_s"], 1),
        "catch_up_traces_exported": int(catching_up["traces_exported"]),
        "feed_full_read_ms": round(reads["full_read_ms"], 1),
        "feed_idle_poll_ms": round(reads["idle_poll_ms"], 2),
        "trace_read_ms": round(reads["trace_read_ms"], 1),  # one poll's episodes: EVENTS_PER_READ
        "trace_episodes_per_read": EVENTS_PER_READ,
        "spans_per_read": reads["spans_per_read"],
        "entries": reads["entries"],
    }
    summary["added_p50_ms"] = round(summary["on_p50_ms"] - summary["off_p50_ms"], 2)
    summary["target_within_5pct_met"] = summary["turns_per_s_change"] >= -0.05
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":  # the feed's own process: LEDGER_URL=… python -m benchmarks.tracking RUN DIR
    asyncio.run(feed_forever(os.environ["LEDGER_URL"], sys.argv[1], Path(sys.argv[2])))
