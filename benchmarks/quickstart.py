"""`uv run python -m benchmarks quickstart`: does the README's first run show learning, and how fast?

It runs the README's command, `rollout train arithmetic.environment:easy --preset cpu-quickstart`
(SmolLM2-135M-Instruct, LoRA rank 8, 40 steps of one-digit sums, on CPU; every service its own process on an
embedded stack in a scratch directory, the model converted beforehand as a second run would find it), `ROUNDS`
times, and reads each run's `--json` summary: the mean reward of the first ten steps and of the last ten, and
the wall time of the whole command (the stack's start included). Baseline, in the same run: the README's first
command before (`rollout train arithmetic.environment:environment --preset cpu-micro`: a random-weight model,
5 steps), whose reward does not rise.

Target (issue 34): in about three minutes here, the last ten steps' mean reward beats the first ten's by at
least 0.1, in every round. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROUNDS = 2
TARGET_GAIN = 0.1
TARGET_S = 180.0
QUICKSTART = ["arithmetic.environment:easy", "--preset", "cpu-quickstart"]
BASELINE = ["arithmetic.environment:environment", "--preset", "cpu-micro"]


def _models_dir() -> Path:
    return Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )


def one_run(arguments: list[str], scratch: Path) -> dict[str, Any]:
    """One `rollout train ... --json` on a stack of its own: its summary, wall time and exit code."""
    from rollout_testing.stacks import isolated_overrides

    overrides = [*isolated_overrides(scratch / "data", gateway=True), f"models_dir={_models_dir()}"]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "rollout.cli", "train", *arguments, "--json", *overrides],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    wall_s = time.monotonic() - started
    subprocess.run(
        [sys.executable, "-m", "rollout.cli", "down", *overrides], capture_output=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"rollout train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    first, last = summary["reward_first"], summary["reward_last"]
    return {
        "wall_s": round(wall_s, 1),
        "steps": summary["steps"],
        "reward_first": first,
        "reward_last": last,
        "gain": round(last - first, 4),
        "reward_by_step": summary["reward_by_step"],
    }


def main(quick: bool = False) -> int:
    from rollout.engines.models import SMOLLM2, resolve

    resolve(SMOLLM2, _models_dir())  # converted once, before any clock starts
    rounds = 1 if quick else ROUNDS
    results: dict[str, list[dict[str, Any]]] = {"quickstart": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="rollout-bench-quickstart-") as scratch:
        for index in range(rounds):
            for name, arguments in (("quickstart", QUICKSTART), ("baseline", BASELINE)):
                result = one_run(arguments, Path(scratch) / f"{name}-{index}")
                results[name].append(result)
                print(json.dumps({"run": name, "round": index} | result), flush=True)
    quickstart = results["quickstart"]
    summary = {
        "benchmark": "quickstart",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "rounds": rounds,
        "gains": [r["gain"] for r in quickstart],
        "baseline_gains": [r["gain"] for r in results["baseline"]],
        "wall_s": [r["wall_s"] for r in quickstart],
        "target_gain": TARGET_GAIN,
        "target_s": TARGET_S,
        "met": all(r["gain"] >= TARGET_GAIN and r["wall_s"] <= TARGET_S * 1.1 for r in quickstart),
    }
    print(json.dumps(summary))
    return 0 if summary["met"] else 1
