"""The embedded stack (Postgres, Temporal) a benchmark measures on.

Contract: `bench_stack(scratch)` yields a `BenchStack`: by default a stack of the benchmark's own in
`scratch/data` on free ports, started, and stopped when the block ends. Where `ROLLOUT_BENCH_STACK` holds a
running stack's settings as overrides (a JSON list: `rollout.overrides.overrides_for(settings, "data_dir",
"services")`), it is that stack, left running: the suite's smoke tier runs every benchmark's quick form on
the stack its worker already has, instead of starting one per benchmark. Either way the services a benchmark
starts on it (engines, gateways, runners) are its own, and it stops them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.stack.embedded import Stack

STACK_VARIABLE = "ROLLOUT_BENCH_STACK"


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
