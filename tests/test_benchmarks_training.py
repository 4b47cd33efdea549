"""The training benchmarks cannot rot unnoticed either: learning, stability, race, quickstart and multipolicy
run in their quick form here, as a user runs them (`python -m benchmarks NAME --quick`), and must measure what
they say they do, in their one JSON line last.

Each of them runs `rollout train` (twice, for some): here all of them on one `rollout up` stack this module
shares (`ROLLOUT_BENCH_TRAIN_STACK`: benchmarks.stack), each command starting only what the stack lacks,
rather than a stack of their own each. Their quick forms all train `cpu-micro`'s tiny random model, which the
stack's engine serves; whether a target is met is each benchmark's to report, not a test's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.stack import TRAIN_STACK_VARIABLE
from rollout_testing.stacks import isolated_overrides
from tests.test_benchmarks_quick import quick_form

pytestmark = pytest.mark.slow

ROLLOUT = str(Path(sys.executable).parent / "rollout")


def _trained(steps: int) -> Callable[[dict[str, Any]], bool]:
    return lambda found: found["steps"] == steps and found["finished"] is True


MEASURES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "learning": _trained(2),
    "stability": lambda found: (
        found["compared_batches"] == 2
        and 0 < found["ppo_weight_ess_min"] <= 1
        and found["is_stable"] in (True, False)
    ),
    "race": lambda found: found["trl"]["steps"] > 0 and found["rollout"]["steps"] == 2,
    "quickstart": lambda found: len(found["gains"]) == 1 and isinstance(found["baseline_gain"], float),
    "multipolicy": lambda found: all(rate > 0 for rate in found["episodes_per_s"].values()),
}


@pytest.fixture(scope="module")
def training_stack(
    tmp_path_factory: pytest.TempPathFactory, models_dir: Path, tiny_qwen3: str
) -> Iterator[str]:
    """`rollout up` on cpu-micro's tiny model, with the gateway: the overrides its commands take, as JSON."""
    root = tmp_path_factory.mktemp("bench-training")
    overrides = [*isolated_overrides(root / "data", gateway=True), f"models_dir={models_dir}"]
    try:
        up = subprocess.run(
            [ROLLOUT, "up", *overrides, "preset=cpu-micro"], capture_output=True, text=True, timeout=300
        )
        assert up.returncode == 0, up.stderr[-3000:]
        yield json.dumps(overrides)
    finally:
        subprocess.run([ROLLOUT, "down", *overrides], capture_output=True, timeout=300, check=False)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(MEASURES))
def test_a_training_benchmarks_quick_form_measures_what_it_says(name: str, training_stack: str) -> None:
    last = quick_form(name, {**os.environ, TRAIN_STACK_VARIABLE: training_stack}, timeout_s=840)
    assert MEASURES[name](last), last
