"""Episodes per second and platform overhead per episode, for 1-turn and 10-turn episodes, 2 runner workers.

Everything is real and local: Postgres and the Temporal dev server (embedded stack), a scripted engine that
answers at once (`rollout engine serve --kind scripted`), `rollout gateway`, and two `rollout worker runner`
processes, each its own process on this machine. The environments are `arithmetic` (1 turn) and `gridworld`
(10 turns on a shortest path), played by their scripted policies.

- Baseline (same run): the same Tasks played by the same agent loop against the scripted policy in process, no
  services (what an episode costs with no platform at all).
- Latency: episodes one after another (groups of one, one group in flight); the platform overhead per episode
  is the mean latency of an `EpisodeWorkflow` (start to close, from Temporal) minus the baseline's.
- Throughput: many groups in flight; episodes finished per second of wall time, from the run's start to its
  end.
Targets (issue 4): >= 20 one-turn episodes/s; <= 50 ms overhead per episode.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from arithmetic.environment import environment as arithmetic
from gridworld.environment import environment as gridworld
from rollout.activities.agent_loop import play
from rollout.environment import Environment
from rollout.harness import RunContext

# Groups of one, for the latency phase (`benchmarks.episodes:arithmetic_single`).
arithmetic_single = replace(arithmetic, group_size=1)
gridworld_single = replace(gridworld, group_size=1)
KINDS = {
    "one_turn": ("arithmetic.environment:environment", "benchmarks.episodes:arithmetic_single", arithmetic),
    "ten_turn": ("gridworld.environment:environment", "benchmarks.episodes:gridworld_single", gridworld),
}


class _Scripted:
    def __init__(self, environment: Environment) -> None:
        assert environment.scripted_reply is not None
        self.reply_with = environment.scripted_reply

    async def reply(self, messages: Any, tools: Any) -> Any:
        return self.reply_with(messages, tools)


async def baseline_ms(environment: Environment, episodes: int) -> tuple[float, int]:
    """Mean ms per episode with no platform: the Task and the scripted policy in process. Also the turns."""
    model = _Scripted(environment)
    started, turns = time.perf_counter(), 0
    for group in range(episodes):
        parameters = environment.source.parameters(group)
        context = RunContext(run="bench", episode=f"e{group}", seat="seat", attempt=1, parameters=parameters)
        outcome = await play(
            environment.make_task(parameters, "solver"), context, model, max_turns=environment.max_turns
        )
        assert outcome.reward == 1.0
        turns = outcome.turns
    return (time.perf_counter() - started) * 1000 / episodes, turns


async def _run(
    client: Any, queue: str, reference: str, groups_in_flight: int, max_groups: int
) -> tuple[Any, float]:
    from rollout.workflows.names import run_workflow_id
    from rollout.workflows.run import RunWorkflow
    from rollout.workflows.run_types import RunInput

    run = f"bench-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    status = await client.execute_workflow(
        RunWorkflow.run,
        RunInput(run, reference, groups_in_flight=groups_in_flight, max_groups=max_groups),
        id=run_workflow_id(run),
        task_queue=queue,
    )
    return (run, status), time.perf_counter() - started


async def _episode_latencies_ms(client: Any, run: str, episodes: list[str]) -> list[float]:
    from rollout.workflows.names import episode_workflow_id

    latencies = []
    for episode in episodes:
        described = await client.get_workflow_handle(episode_workflow_id(run, episode)).describe()
        latencies.append((described.close_time - described.start_time).total_seconds() * 1000)
    return latencies


async def _timeline_ms(client: Any, run: str, episodes: list[str]) -> dict[str, float]:
    """Where an episode's time goes: the median ms between consecutive events of its Temporal history, each
    step named by the event that ends it (a history's events are the same kinds in the same order for every
    episode of one environment)."""
    from temporalio.api.enums.v1 import EventType

    from rollout.workflows.names import episode_workflow_id

    steps: dict[str, list[float]] = {}
    for episode in episodes:
        history = await client.get_workflow_handle(episode_workflow_id(run, episode)).fetch_history()
        events = history.events
        for before, after in itertools.pairwise(events):
            gap = (after.event_time.ToDatetime() - before.event_time.ToDatetime()).total_seconds() * 1000
            name = EventType.Name(after.event_type).removeprefix("EVENT_TYPE_").lower()
            steps.setdefault(f"{after.event_id:02d} {name}", []).append(gap)
    return {step: round(statistics.median(gaps), 1) for step, gaps in sorted(steps.items())}


async def measure(settings: Any, queue: str, quick: bool) -> dict[str, Any]:
    from temporalio.client import Client

    from rollout.workflows.names import episode_id

    client = await Client.connect(settings.temporal_address)
    results: dict[str, Any] = {}
    for name, (reference, single, environment) in KINDS.items():
        sequential = 8 if quick else 40
        groups = 4 if quick else (40 if name == "one_turn" else 12)
        base, turns = await baseline_ms(environment, sequential)
        await _run(client, queue, single, 1, 2)  # warm: imports, caches, connections
        (run, status), _ = await _run(client, queue, single, 1, sequential)
        assert status.episodes_finished == sequential, status
        latencies = await _episode_latencies_ms(client, run, [episode_id(g, 0) for g in range(sequential)])
        timeline = await _timeline_ms(client, run, [episode_id(g, 0) for g in range(sequential)])
        print(f"{name}, median ms before each event of an episode's history: {timeline}", file=sys.stderr)
        (run, status), wall_s = await _run(client, queue, reference, 8, groups)
        finished = status.episodes_finished
        assert finished == groups * environment.group_size and status.episodes_failed == 0, status
        latency = statistics.mean(latencies)
        results[name] = {
            "turns": turns,
            "episodes_per_s": round(finished / wall_s, 2),
            "episode_latency_ms": round(latency, 1),
            "episode_latency_p50_ms": round(statistics.median(latencies), 1),
            "baseline_ms": round(base, 2),
            "overhead_ms": round(latency - base, 1),
            "overhead_per_turn_ms": round((latency - base) / turns, 1),
            "throughput_episodes": finished,
        }
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    return results


def main(quick: bool = False) -> int:
    from benchmarks.stack import bench_stack
    from rollout_testing.cluster import Cluster

    models_dir = Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )
    from rollout.engines.models import TINY_QWEN3, resolve

    resolve(TINY_QWEN3, models_dir)
    with (
        tempfile.TemporaryDirectory(prefix="rollout-bench-episodes-") as scratch,
        bench_stack(Path(scratch)) as bench,
    ):
        settings = bench.settings
        cluster = Cluster(
            settings=settings,
            root=Path(scratch) / "cluster",
            models_dir=models_dir,
            task_queue="bench-runner",
        )
        try:
            gateway = cluster.gateway(cluster.engine(think_ms=0))
            cluster.runner("runner-1", gateway)
            cluster.runner("runner-2", gateway)
            results = asyncio.run(measure(settings, cluster.task_queue, quick))
        finally:
            cluster.close()
    one, ten = results["one_turn"], results["ten_turn"]
    summary = {
        "benchmark": "episodes",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
        "runners": 2,
        **{f"one_turn_{k}": v for k, v in one.items()},
        **{f"ten_turn_{k}": v for k, v in ten.items()},
        "target_20_eps_met": one["episodes_per_s"] >= 20,
        "target_50ms_overhead_met": one["overhead_ms"] <= 50,
    }
    print(json.dumps(summary))
    return 0
