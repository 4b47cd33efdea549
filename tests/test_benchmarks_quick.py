"""Benchmarks that cannot rot unnoticed: each runs in its quick form here, as a user runs it (`python -m
benchmarks NAME --quick`), and must measure what it says it does, in its one JSON line last. Whether a target
is met is each benchmark's to report (benchmarks/RESULTS.md), not a test's.

Those that measure on an embedded stack (episodes, temporal, gateway, tracking, multiturn, async) run on the
worker's session stack (`ROLLOUT_BENCH_STACK`: benchmarks.stack) rather than start one each; the services they
start on it are their own; minecraft's worlds run the packages the session installed once. The five that train
are in tests/test_benchmarks_training.py, `ledger`'s quick form runs in `.ci/run` before the tests, and
chaos's matrix in tests/test_chaos_stack.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.stack import STACK_VARIABLE
from rollout.config import Settings
from rollout.config.overrides import overrides_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _numbers(*keys: str) -> Callable[[dict[str, Any]], bool]:
    return lambda found: all(isinstance(found.get(key), int | float) for key in keys)


MEASURES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "sandbox": lambda found: (
        found["jailed_ms"]["true"]["p50"] > 0 and found["unjailed_ms"]["true"]["p50"] > 0
    ),
    "startup": lambda found: all(seconds > 0 for seconds in found["p50_s"].values()),
    "gpu": lambda found: found["ran"] is False or _numbers("tokens_per_s")(found),  # off a GPU it says so
    "monitor": _numbers("seed_s", "slowest_s", "first_transcript_s"),
    "treetrain": lambda found: found["group"]["speedup"] > 0,
}
ON_THE_STACK: dict[str, Callable[[dict[str, Any]], bool]] = {
    "episodes": _numbers("one_turn_episodes_per_s", "one_turn_overhead_ms", "ten_turn_episodes_per_s"),
    "temporal": lambda found: bool(found["levels"]) and found["levels"][0]["in_flight"] > 0,
    "gateway": _numbers("rollout_c1_turns_per_s", "litellm_c1_turns_per_s", "rollout_stream_ttft_p50_ms"),
    "tracking": _numbers("off_turns_per_s", "on_turns_per_s", "feed_full_read_ms"),
    "multiturn": _numbers("cache_speedup", "affine_hit_rate", "turns_per_s_ratio"),
    "async": _numbers("speedup_lag4", "reward_difference_lag4"),
}


def quick_form(
    name: str, environment: dict[str, str] | None = None, timeout_s: float = 540
) -> dict[str, Any]:
    """The last line of `python -m benchmarks NAME --quick`: 0, or 1 where the benchmark says it missed a
    target; anything else is a benchmark that broke."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=environment,
    )
    said = done.stdout.strip().splitlines()
    assert done.returncode in (0, 1) and said, done.stderr[-3000:]
    last = json.loads(said[-1])
    assert last["benchmark"] == name, last
    return last


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(MEASURES))
def test_a_benchmarks_quick_form_measures_what_it_says(name: str) -> None:
    last = quick_form(name)
    assert MEASURES[name](last), last


@pytest.mark.timeout(600)
def test_the_minecraft_benchmarks_quick_form_measures_a_world(minecraft_home: Path) -> None:
    """Its worlds run the packages `minecraft_home` installed (set in this process's environment)."""
    last = quick_form("minecraft")
    assert last["world_ready_s_p50"] > 0 and last["actions"] > 0 and last["round_trip_ms_p50"] > 0, last


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(ON_THE_STACK))
def test_a_benchmarks_quick_form_measures_on_a_running_stack(name: str, stack_settings: Settings) -> None:
    shared = overrides_for(stack_settings, "data_dir", "services")
    last = quick_form(name, {**os.environ, STACK_VARIABLE: json.dumps(shared)})
    assert ON_THE_STACK[name](last), last
