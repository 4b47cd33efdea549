"""The embedded stacks benchmarks measure on, and where their models are.

Contract:
- `bench_stack(scratch)` yields a `BenchStack` (Postgres, Temporal): by default a stack of the benchmark's own
  in `scratch/data` on free ports, started, and stopped when the block ends. Where `ROLLOUT_BENCH_STACK`
  holds a running stack's settings as overrides (a JSON list:
  `rollout.config.overrides.overrides_for(settings, "data_dir", "services")`), it is that stack, left running:
  the suite runs benchmarks' quick forms on the stack its worker already has instead of starting one each.
  Either way the services a benchmark starts on it (engines, gateways, runners) are its own, and it stops
  them.
- `train_stack(data_dir)` yields the overrides a benchmark's `rollout train` runs with: by default a stack of
  its own in `data_dir` (the gateway on, `models_dir()`), which `rollout train` starts and `rollout down`
  stops when the block ends; where `ROLLOUT_BENCH_TRAIN_STACK` holds a running `rollout up` stack's
  overrides (a JSON list), that stack, left running: each `rollout train` starts only what it lacks. Its
  engine serves one base model, so the quick forms that share one all train `cpu-micro`'s.
- `models_dir()` is where benchmarks keep converted and built-in models, as the tests do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.stack.embedded import Stack

STACK_VARIABLE = "ROLLOUT_BENCH_STACK"
TRAIN_STACK_VARIABLE = "ROLLOUT_BENCH_TRAIN_STACK"


def models_dir() -> Path:
    return Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )


@dataclass(frozen=True)
class BenchStack:
    overrides: list[str]
    """The stack's settings as overrides, for the processes a benchmark starts on it."""
    settings: Settings
    stack: Stack


@contextmanager
def bench_stack(scratch: Path) -> Iterator[BenchStack]:
    from rollout import config
    from rollout.stack.embedded import Stack
    from rollout_testing.stacks import isolated_overrides

    if given := os.environ.get(STACK_VARIABLE):
        overrides = [str(override) for override in json.loads(given)]
        settings = config.load(overrides)
        yield BenchStack(overrides, settings, Stack(settings))
        return
    overrides = isolated_overrides(scratch / "data")
    settings = config.load(overrides)
    stack = Stack(settings)
    try:
        stack.up()
        yield BenchStack(overrides, settings, stack)
    finally:
        stack.down()


@contextmanager
def train_stack(data_dir: Path) -> Iterator[list[str]]:
    from rollout_testing.stacks import isolated_overrides

    if given := os.environ.get(TRAIN_STACK_VARIABLE):
        yield [str(override) for override in json.loads(given)]
        return
    overrides = [*isolated_overrides(data_dir, gateway=True), f"models_dir={models_dir()}"]
    try:
        yield overrides
    finally:
        subprocess.run(
            [sys.executable, "-m", "rollout.cli", "down", *overrides], capture_output=True, check=False
        )
