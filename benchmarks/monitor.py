"""`uv run python -m benchmarks monitor`: how long each dashboard view takes to render with a big ledger.

A throwaway embedded Postgres is seeded with what a long campaign leaves: 10 training runs of 100 steps (1,000
checkpoints with their bridges and serving targets), 25,000 episodes of 4 turns each (100,000 turns, each with
its token ids and logprobs), engine acks, eval results and leases. Each view (Runs with one run chosen,
Transcripts of one run with an episode open, the Checkpoint tree of all runs, Evals, Machines) is rendered
with Streamlit's AppTest, several times; the baseline is the same view on a ledger holding one small run, so
the ratio shows what the data costs. Target (issue 15): every view under 1 s. Then the first transcript a new
dashboard process opens (its modules and the model's tokenizer loaded then; issue 34: under 2 s). One JSON
line per view, then the summary as the last line.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollout import config
from rollout.engines.models import TINY_QWEN3, resolve
from rollout.ledger import Kind, Ledger, NewEvent, migrate
from rollout.ledger.streams import (
    EVAL_SUITES,
    SERVING_ACKS,
    SERVING_TARGETS,
    eval_results_stream,
    policy_bridges_stream,
    policy_checkpoints_stream,
    run_episodes_stream,
    run_stream,
    seat_stream,
)
from rollout.net import free_port
from rollout.stack.embedded import give_service_logins
from rollout.stack.postgres import EmbeddedPostgres

VIEWS = ("runs", "transcripts", "checkpoints", "evals", "machines")
TARGET_S = 1.0
FIRST_TRANSCRIPT_TARGET_S = 2.0  # issue 34: a transcript opens in under 2 s, the first one included
TURNS_PER_EPISODE = 4


def episode_events(
    run: str, n: int, version: int, rng: random.Random
) -> tuple[str, list[NewEvent], NewEvent]:
    """Episode `n` of `run` (one solver seat of `TURNS_PER_EPISODE` turns sampled by checkpoint `version`):
    its seat, the seat's turns, and its `EpisodeFinished`."""
    episode, seat = f"g{n:06d}-0", f"{run}/g{n:06d}-0/solver"
    turns = [
        NewEvent(f"turn/{i}/f{i}", Kind.TURN_RECORDED, _turn(run, episode, seat, i, version, rng))
        for i in range(TURNS_PER_EPISODE)
    ]
    finished = NewEvent(
        f"{episode}/finished",
        Kind.EPISODE_FINISHED,
        {
            "run": run,
            "episode": episode,
            "group": n,
            "finished": True,
            "environment": "arithmetic.environment:environment",
            "rewards": {"solver": rng.random()},
            "error": None,
            "seats": {"solver": seat},
            "turns": {"solver": TURNS_PER_EPISODE},
            "metrics": {},
            "sandbox": None,
        },
    )
    return seat, turns, finished


def _turn(run: str, episode: str, seat: str, index: int, version: int, rng: random.Random) -> dict[str, Any]:
    completion = [rng.randrange(150000) for _ in range(64)]
    return {
        "seat": seat,
        "run": run,
        "episode": episode,
        "agent": "solver",
        "policy": f"{run}/default",
        "turn_index": index,
        "fingerprint": f"f{index}",
        "segment_id": f"{seat}-s",
        "prompt_prefix_len": 0 if index == 0 else 100 * index,
        "prompt_ids_delta": [rng.randrange(150000) for _ in range(32)],
        "completion_ids": completion,
        "completion_logprobs": [round(-rng.random() * 3, 4) for _ in completion],
        "checkpoint": "base" if version == 0 else f"{run}/default-step{version:06d}",
        "checkpoint_version": version,
        "engine": "engine-a",
        "admitted_newest": version,
        "admitted_max_lag": 1,
        "finish_reason": "stop",
        "stop_sequence": None,
        "reply": {"role": "assistant", "text": "forty-two"},
        "parse_failures": [],
        "n_messages": 1 + 2 * index,
        "messages_sha": "m",
        "tools_sha": "t",
        "timings": {},
        "aborted": None,
    }


async def seed(ledger: Ledger, *, runs: int, steps: int, episodes: int) -> str:
    """A campaign's worth of events; returns the run a view is opened on."""
    rng = random.Random(0)
    names = [f"bench-{r:02d}" for r in range(runs)]
    for run in names:
        await ledger.append_one(
            run_stream(run),
            NewEvent(
                "created",
                Kind.RUN_CREATED,
                {"run": run, "environment": "arithmetic.environment:environment", "settings": {"max_lag": 1}},
            ),
        )
        policy = f"{run}/default"
        checkpoints, bridges, targets = [], [], []
        for step in range(1, steps + 1):
            name = f"{policy}-step{step:06d}"
            metrics = {
                "reward_mean": rng.random(),
                "staleness_mean": rng.random(),
                "effective_sample_size": rng.random(),
                "clipped_fraction": rng.random() / 10,
                "kl_k3": rng.random() / 100,
                "loss": rng.random(),
            }
            parent = None if step == 1 else f"{policy}-step{step - 1:06d}"
            checkpoints.append(
                NewEvent(
                    f"step/{step}",
                    Kind.CHECKPOINT_CREATED,
                    {
                        "name": name,
                        "policy": policy,
                        "version": step,
                        "parent": parent,
                        "run": run,
                        "files": {},
                        "metrics": metrics,
                    },
                )
            )
            bridges.append(
                NewEvent(
                    f"bridge/{step}/lora",
                    Kind.CHECKPOINT_CONVERTED,
                    {"name": name, "version": step, "format": "lora", "files": {}},
                )
            )
            targets.append(
                NewEvent(
                    f"{policy}/{step}/lora",
                    Kind.SERVING_TARGET,
                    {
                        "policy": policy,
                        "checkpoint": name,
                        "version": step,
                        "run": run,
                        "format": "lora",
                        "files": {},
                        "location": None,
                    },
                )
            )
        await ledger.append(policy_checkpoints_stream(policy), checkpoints)
        await ledger.append(policy_bridges_stream(policy), bridges)
        await ledger.append(SERVING_TARGETS, targets)
        ended = []
        per_run = episodes // runs
        for n in range(per_run):
            seat, turns, finished = episode_events(run, n, n * steps // per_run, rng)
            await ledger.append(seat_stream(seat), turns)
            ended.append(finished)
            if len(ended) == 500:
                await ledger.append(run_episodes_stream(run), ended)
                ended = []
        if ended:
            await ledger.append(run_episodes_stream(run), ended)
    acks = [
        NewEvent(
            f"engine-a/i/{n}",
            Kind.SERVING_ACK,
            {
                "engine": "engine-a",
                "url": "http://127.0.0.1:1",
                "incarnation": "i",
                "n": n,
                "base": "base",
                "serving": [],
                "sleeping": False,
                "gpu": None,
                "failed": None,
            },
        )
        for n in range(1, runs * steps + 1)
    ]
    await ledger.append(SERVING_ACKS, acks)
    await ledger.append_one(
        EVAL_SUITES, NewEvent("bench@1", Kind.EVAL_SUITE_REGISTERED, {"suite": {}, "content_hash": "h"})
    )
    results = [
        NewEvent(
            f"1/{names[0]}/default-step{step:06d}/{env}",
            Kind.EVAL_RESULT,
            {
                "suite": "bench",
                "version": "1",
                "suite_hash": "h",
                "checkpoint": f"{names[0]}/default-step{step:06d}",
                "checkpoint_version": step,
                "policy": f"{names[0]}/default",
                "environment": env,
                "reference": "x:y",
                "metric": "mean_reward",
                "score": rng.random(),
                "low": 0.0,
                "high": 1.0,
                "episodes": 8,
                "failed": 0,
                "run": "eval",
                "seats": [],
            },
        )
        for step in range(10, steps + 1, 10)
        for env in ("arithmetic", "gridworld", "math")
    ]
    await ledger.append(eval_results_stream("bench"), results)
    return names[-1]


def render_time(view: str, settings: config.Settings, run: str, repeats: int) -> float:
    """The median seconds AppTest takes to run `view` (a fresh session each time, as a new browser tab)."""
    from streamlit.testing.v1 import AppTest

    def script(name: str, settings: object) -> None:
        import importlib

        from rollout.config import Settings
        from rollout.monitor.context import Monitor

        assert isinstance(settings, Settings)
        importlib.import_module(f"rollout.monitor.{name}").render(Monitor(settings))

    times = []
    for _ in range(repeats):
        app = AppTest.from_function(script, args=(view, settings), default_timeout=120)
        app.query_params["run"] = run
        started = time.perf_counter()
        app.run()
        times.append(time.perf_counter() - started)
        if app.exception:
            raise RuntimeError(f"view {view} raised: {[e.value for e in app.exception]}")
    return statistics.median(times)


def first_open(view: str, overrides: list[str], run: str) -> float:
    """Seconds the first render of `view` takes in this process: what a person waits for the first time they
    open it on a dashboard that has not shown it yet (its modules and the tokenizer loaded then)."""
    from streamlit.testing.v1 import AppTest

    def script(name: str, overrides: object) -> None:
        import importlib

        from rollout import config
        from rollout.monitor.context import Monitor

        assert isinstance(overrides, list)
        importlib.import_module(f"rollout.monitor.{name}").render(Monitor(config.load(overrides)))

    app = AppTest.from_function(script, args=(view, overrides), default_timeout=120)
    app.query_params["run"] = run
    started = time.perf_counter()
    app.run()
    if app.exception:
        raise RuntimeError(f"view {view} raised: {[e.value for e in app.exception]}")
    return time.perf_counter() - started


def first_open_in_new_process(view: str, overrides: list[str], run: str) -> float:
    """`first_open` in a fresh interpreter with a bytecode cache of its own (warmed by one run first, as a
    dashboard that has started before has it)."""
    import subprocess
    import sys

    code = (
        "import json, sys; from benchmarks.monitor import first_open; "
        "print(first_open(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]))"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {
            "PYTHONPYCACHEPREFIX": cache
        }
        seconds = []
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-c", code, view, json.dumps(overrides), run],
                capture_output=True,
                text=True,
                env=env,
                check=True,
                cwd=Path(__file__).resolve().parent.parent,
            )
            seconds.append(float(done.stdout.strip().splitlines()[-1]))
    return seconds[-1]


async def _seeded(data_dir: Path, **sizes: int) -> tuple[EmbeddedPostgres, config.Settings, list[str], str]:
    port = free_port()
    postgres = EmbeddedPostgres(data_dir, "127.0.0.1", port)
    await asyncio.to_thread(postgres.start)
    # The transcripts decode tokens with the tiny model's tokenizer (built once per machine, as the tests do).
    models_dir = Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )
    resolve(TINY_QWEN3, models_dir)
    overrides = [
        f"data_dir={data_dir}",
        f"services.postgres.port={port}",
        f"models_dir={models_dir}",
        "services.gateway.model=tiny-qwen3",
        f"services.temporal.port={free_port()}",
        f"services.gateway.port={free_port()}",
        f"services.gateway.engine_port={free_port()}",
        "services.monitor.enabled=false",
    ]
    settings = config.load(overrides)
    await asyncio.to_thread(migrate.upgrade, settings.ledger_url)
    # The dashboard reads as the stack's read-only role, which logs in as `rollout up` lets it.
    await asyncio.to_thread(give_service_logins, settings)
    async with await Ledger.connect(settings.ledger_url) as ledger:
        run = await seed(ledger, **sizes)
    return postgres, settings, overrides, run


def main(quick: bool = False) -> int:
    sizes = {"runs": 10, "steps": 20 if quick else 100, "episodes": 2_500 if quick else 25_000}
    repeats = 2 if quick else 5
    lines = []
    with tempfile.TemporaryDirectory(prefix="rollout-bench-monitor-") as scratch:
        started = time.perf_counter()
        big, big_settings, big_overrides, big_run = asyncio.run(_seeded(Path(scratch) / "big", **sizes))
        seeded_s = time.perf_counter() - started
        small, small_settings, _, small_run = asyncio.run(
            _seeded(Path(scratch) / "small", runs=1, steps=3, episodes=12)
        )
        try:
            for view in VIEWS:
                base_s = render_time(view, small_settings, small_run, repeats)
                view_s = render_time(view, big_settings, big_run, repeats)
                line = {
                    "view": view,
                    "render_s": round(view_s, 3),
                    "baseline_s": round(base_s, 3),
                    "ratio": round(view_s / base_s, 2) if base_s else None,
                    "under_target": view_s < TARGET_S,
                }
                print(json.dumps(line), flush=True)
                lines.append(line)
            first_transcript_s = first_open_in_new_process("transcripts", big_overrides, big_run)
            print(
                json.dumps(
                    {
                        "view": "transcripts, first open in a new process",
                        "render_s": round(first_transcript_s, 3),
                        "target_s": FIRST_TRANSCRIPT_TARGET_S,
                    }
                ),
                flush=True,
            )
        finally:
            big.remove()
            small.remove()
    summary = {
        "benchmark": "monitor",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "turns": sizes["episodes"] * TURNS_PER_EPISODE,
        "checkpoints": sizes["runs"] * sizes["steps"],
        "seed_s": round(seeded_s, 1),
        "slowest_view": max(lines, key=lambda line: line["render_s"])["view"],
        "slowest_s": max(line["render_s"] for line in lines),
        "target_s": TARGET_S,
        "all_under_target": all(line["under_target"] for line in lines),
        "first_transcript_s": round(first_transcript_s, 3),
        "first_transcript_under_target": first_transcript_s < FIRST_TRANSCRIPT_TARGET_S,
    }
    print(json.dumps(summary))
    return 0 if summary["all_under_target"] and summary["first_transcript_under_target"] else 1
