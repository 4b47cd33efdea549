"""Benchmarks that cannot rot unnoticed, begun: those that need no stack of services and no training run
(sandbox, startup, gpu, treetrain, and monitor with its own two Postgres servers) run in their quick form
here, as a user runs them (`python -m benchmarks NAME --quick`), and must measure what they say they do, in
their one JSON line last. Whether a target is met is each benchmark's to report (benchmarks/RESULTS.md), not
a test's. `ledger`'s quick form runs in `.ci/run` before the tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(MEASURES))
def test_a_benchmarks_quick_form_measures_what_it_says(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    # 0, or 1 where a benchmark says it missed a target: anything else is a benchmark that broke.
    assert done.returncode in (0, 1), done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["benchmark"] == name, last
    assert MEASURES[name](last), last
