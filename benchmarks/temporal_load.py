"""`uv run python -m benchmarks temporal`: how many episodes can play at once before the embedded Temporal
falls behind on this machine.

Everything is real and local, as in `benchmarks episodes`: Postgres and the Temporal dev server of the
embedded stack (its SQLite file, its dispatch settings), a scripted engine that thinks `THINK_MS` per turn
(the pace of a small model on a CPU), `rollout gateway`, and two `rollout worker runner` processes. Each
level plays 10-turn gridworld episodes (groups of one) with `in_flight` episode workflows at once (several
runs of at most `PER_RUN` each), two waves of them, while a probe asks Temporal to describe a run's workflow
twice a second (a read through its frontend, history service and SQLite, as every wait of the CLI makes).

Per level: how many episodes played at once (mean and peak, from their start and close times); episodes per
second; each turn's overhead beyond the engine's think time; the probe's p50/p95/max; the dev server's CPU
share; errors in its log ("context deadline exceeded": its persistence timing out). Baseline (same run): the
lowest level, `in_flight` 2.

Temporal has fallen behind at a level when the probe's p95 passes `PROBE_P95_LIMIT_MS`, its log shows an
error, or the overhead per turn is more than `OVERHEAD_FACTOR` times the baseline's. The last line's
`healthy_up_to` is the highest level before the first that fell behind (the levels stop there). `--quick`
checks that it works: levels 2 and 8, `QUICK_THINK_MS` a turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil

LEVELS = (2, 8, 16, 32, 64, 128, 256, 384)
QUICK_LEVELS = (2, 8)
THINK_MS = 2000
QUICK_THINK_MS = 200  # `--quick` only checks that it works: shorter episodes
TURNS = 10
PROBE_EVERY_S = 0.5
PROBE_P95_LIMIT_MS = 1000.0
OVERHEAD_FACTOR = 4.0
ENVIRONMENT = "benchmarks.episodes:gridworld_single"
# Episodes in flight per run: a run's supply starts a fresh history every 100 groups, once those in flight
# have ended (`GROUPS_PER_HISTORY`), so one run's two waves of more would not keep the level in flight.
PER_RUN = 48


async def _probe(client: Any, workflow_id: str, until: asyncio.Event, latencies: list[float]) -> None:
    handle = client.get_workflow_handle(workflow_id)
    while not until.is_set():
        started = time.perf_counter()
        with contextlib.suppress(Exception):  # a probe that fails counts by its time, like a slow one
            await handle.describe(rpc_timeout=timedelta(seconds=30))
        latencies.append((time.perf_counter() - started) * 1000)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until.wait(), PROBE_EVERY_S)


async def _episode_spans(client: Any, run: str, episodes: int) -> list[tuple[float, float]]:
    """Each finished episode's (start, close), in seconds since the epoch, from Temporal."""
    from rollout.workflows.names import episode_id, episode_workflow_id

    spans = []
    for group in range(episodes):
        handle = client.get_workflow_handle(episode_workflow_id(run, episode_id(group, 0)))
        described = await handle.describe()
        if described.close_time is not None and described.start_time is not None:
            spans.append((described.start_time.timestamp(), described.close_time.timestamp()))
    return spans


def _concurrency(spans: list[tuple[float, float]]) -> tuple[float, int]:
    """The mean number of episodes playing over the spans' whole extent, and the most at any moment."""
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    mean = sum(e - s for s, e in spans) / max(last - first, 1e-9)
    playing = peak = 0
    for _, change in sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans]):
        playing += change
        peak = max(peak, playing)
    return mean, peak


def _errors_since(log: Path, offset: int) -> tuple[int, list[str]]:
    with log.open("rb") as file:
        file.seek(offset)
        lines = file.read().decode(errors="replace").splitlines()
    errors = [line for line in lines if "level=ERROR" in line]
    return len(errors), errors[:3]


async def level(
    client: Any, queue: str, in_flight: int, temporal: psutil.Process, log: Path, think_ms: float
) -> dict[str, Any]:
    """`in_flight` episodes at once, as runs of at most `PER_RUN` each (several runs on one Temporal, as
    several runs and evals are), each run two waves of its share."""
    from rollout.workflows.names import run_workflow_id
    from rollout.workflows.run import RunWorkflow
    from rollout.workflows.run_types import RunInput

    shares = [in_flight // -(-in_flight // PER_RUN)] * -(-in_flight // PER_RUN)
    shares[0] += in_flight - sum(shares)
    runs = [(f"load-{in_flight}-{uuid.uuid4().hex[:6]}-{i}", share) for i, share in enumerate(shares)]
    offset = await asyncio.to_thread(lambda: log.stat().st_size)
    cpu_before, wall_before = temporal.cpu_times(), time.perf_counter()
    handles = [
        await client.start_workflow(
            RunWorkflow.run,
            RunInput(run, ENVIRONMENT, groups_in_flight=share, max_groups=2 * share),
            id=run_workflow_id(run),
            task_queue=queue,
        )
        for run, share in runs
    ]
    done, probes = asyncio.Event(), []
    probing = asyncio.create_task(_probe(client, handles[0].id, done, probes))
    statuses = await asyncio.gather(*(handle.result() for handle in handles))
    wall_s = time.perf_counter() - wall_before
    cpu_after = temporal.cpu_times()
    done.set()
    await probing
    spans = [span for run, share in runs for span in await _episode_spans(client, run, 2 * share)]
    overheads = [((end - start) * 1000 - TURNS * think_ms) / TURNS for start, end in spans]
    mean, peak = _concurrency(spans)
    errors, said = _errors_since(log, offset)
    probes.sort()
    finished = sum(status.episodes_finished for status in statuses)
    return {
        "in_flight": in_flight,
        "runs": len(runs),
        "episodes": finished,
        "failed": sum(status.episodes_failed for status in statuses),
        "playing_mean": round(mean, 1),
        "playing_peak": peak,
        "episodes_per_s": round(finished / wall_s, 2),
        "turn_overhead_p50_ms": round(statistics.median(overheads), 1),
        "turn_overhead_p95_ms": round(_p95(sorted(overheads)), 1),
        "probe_p50_ms": round(statistics.median(probes), 1),
        "probe_p95_ms": round(_p95(probes), 1),
        "probe_max_ms": round(probes[-1], 1),
        "temporal_cpu_pct": round(
            100 * (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) / wall_s, 1
        ),
        "temporal_errors": errors,
        "temporal_said": said,
    }


def _p95(values: list[float]) -> float:
    return values[min(len(values) - 1, int(0.95 * len(values)))]


def fell_behind(row: dict[str, Any], baseline: dict[str, Any]) -> str | None:
    """Why Temporal fell behind at this level, or None."""
    if row["temporal_errors"]:
        return f"{row['temporal_errors']} errors in its log"
    if row["probe_p95_ms"] > PROBE_P95_LIMIT_MS:
        return f"probe p95 {row['probe_p95_ms']} ms"
    base, now = baseline["turn_overhead_p50_ms"], row["turn_overhead_p50_ms"]
    if base is not None and now is not None and now > OVERHEAD_FACTOR * max(base, 10.0):
        return f"turn overhead {now} ms, {OVERHEAD_FACTOR:g}× the baseline's {base} ms"
    if row["failed"]:
        return f"{row['failed']} episodes failed"
    return None


async def measure(
    settings: Any, queue: str, levels: tuple[int, ...], temporal_pid: int, think_ms: float
) -> list[dict[str, Any]]:
    from temporalio.client import Client

    client = await Client.connect(settings.temporal_address)
    temporal = psutil.Process(temporal_pid)
    log = settings.data_path / "logs" / "temporal.log"
    rows = []
    for in_flight in levels:
        row = await level(client, queue, in_flight, temporal, log, think_ms)
        row["fell_behind"] = fell_behind(row, rows[0] if rows else row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
        if row["fell_behind"]:
            break  # the levels above would only pile on
    return rows


def main(quick: bool = False) -> int:
    from benchmarks.stack import bench_stack
    from rollout.engines.models import TINY_QWEN3, resolve
    from rollout_testing.cluster import Cluster

    levels, think_ms = (QUICK_LEVELS, QUICK_THINK_MS) if quick else (LEVELS, THINK_MS)
    models_dir = Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )
    resolve(TINY_QWEN3, models_dir)
    with (
        tempfile.TemporaryDirectory(prefix="rollout-bench-temporal-") as scratch,
        bench_stack(Path(scratch)) as bench,
    ):
        settings, stack = bench.settings, bench.stack
        cluster = Cluster(
            settings=settings, root=Path(scratch) / "cluster", models_dir=models_dir, task_queue="bench-load"
        )
        try:
            assert stack.temporal is not None
            temporal_pid = stack.temporal.pid()
            assert temporal_pid is not None
            gateway = cluster.gateway(cluster.engine(think_ms=think_ms))
            per_runner = max(levels) // 2 + 8
            cluster.runner("runner-1", gateway, max_activities=per_runner)
            cluster.runner("runner-2", gateway, max_activities=per_runner)
            rows = asyncio.run(measure(settings, cluster.task_queue, levels, temporal_pid, think_ms))
        finally:
            cluster.close()
    behind = [row for row in rows if row["fell_behind"]]
    healthy = [row["in_flight"] for row in rows if not behind or row["in_flight"] < behind[0]["in_flight"]]
    summary = {
        "benchmark": "temporal",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
        "think_ms": think_ms,
        "turns": TURNS,
        "levels": [{k: row[k] for k in row if k not in ("temporal_said",)} for row in rows],
        "healthy_up_to": max(healthy) if healthy else None,
        "first_behind": behind[0]["in_flight"] if behind else None,
        "why": behind[0]["fell_behind"] if behind else None,
    }
    print(json.dumps(summary))
    return 0
