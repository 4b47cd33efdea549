"""`uv run python -m benchmarks quickstart`: does the README's first run clearly learn, and how fast?

It runs the README's command, `rollout train arithmetic.environment:easy --preset cpu-quickstart`
(SmolLM2-135M-Instruct, LoRA rank 8, one-digit sums, on CPU; every service its own process on an embedded
stack in a scratch directory, the model converted beforehand as a second run would find it), once per seed of
`SEEDS` (`trainer.seed`: the adapter's initial weights; sampling differs run to run too), and reads each
run's `--json` summary: the mean reward of the first ten steps and of the last ten, the run's own time
(`run_s`: from the run's start to its end) and the wall time of the whole command (the stack's start
included). Baseline, in the same run, once: the README's first command of issue 34 (`rollout train
arithmetic.environment:environment --preset cpu-micro`: a random-weight model, 5 steps), whose reward does not
rise.

Target (issue 50): every seed's last ten steps beat its first ten by at least `TARGET_GAIN` (0.15), each run
training for at most `TARGET_S` (4 minutes). The last line printed is one JSON object. `--quick` checks that
it works: one seed, both environments on `cpu-micro`'s tiny random model for 4 steps (`QUICK`), so the
target is not met.
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

from benchmarks.stack import models_dir, train_stack

SEEDS = (0, 1, 2)
TARGET_GAIN = 0.15
TARGET_S = 240.0
QUICKSTART = ["arithmetic.environment:easy", "--preset", "cpu-quickstart"]
BASELINE = ["arithmetic.environment:environment", "--preset", "cpu-micro"]
QUICK = ["--preset", "cpu-micro", "trainer.steps=4"]  # the summary's reward change needs 4 steps


def one_run(arguments: list[str], scratch: Path) -> dict[str, Any]:
    """One `rollout train ... --json` on a stack (benchmarks.stack: `train_stack`, its own unless one is
    given): its summary, wall time and exit code."""
    with train_stack(scratch / "data") as overrides:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "rollout.cli", "train", *arguments, "--json", *overrides],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        wall_s = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"rollout train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    first, last = summary["reward_first"], summary["reward_last"]
    return {
        "wall_s": round(wall_s, 1),
        "run_s": summary["run_s"],
        "groups_replaced": summary.get("groups_replaced", 0),
        "batches_skipped": summary["batches_skipped"],
        "steps": summary["steps"],
        "reward_first": first,
        "reward_last": last,
        "gain": round(last - first, 4),
        "reward_by_step": summary["reward_by_step"],
    }


def main(quick: bool = False) -> int:
    from rollout.engines.models import SMOLLM2, TINY_QWEN3, resolve

    resolve(TINY_QWEN3 if quick else SMOLLM2, models_dir())  # converted once, before any clock starts
    seeds = SEEDS[:1] if quick else SEEDS
    quickstart_run, baseline_run = (
        ([QUICKSTART[0], *QUICK], [BASELINE[0], *QUICK]) if quick else (QUICKSTART, BASELINE)
    )
    quickstart: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rollout-bench-quickstart-") as scratch:
        for seed in seeds:
            result = one_run([*quickstart_run, f"trainer.seed={seed}"], Path(scratch) / f"quickstart-{seed}")
            quickstart.append({"seed": seed} | result)
            print(json.dumps({"run": "quickstart"} | quickstart[-1]), flush=True)
        baseline = one_run(baseline_run, Path(scratch) / "baseline")
        print(json.dumps({"run": "baseline"} | baseline), flush=True)
    summary = {
        "benchmark": "quickstart",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "seeds": list(seeds),
        "gains": [r["gain"] for r in quickstart],
        "run_s": [r["run_s"] for r in quickstart],
        "wall_s": [r["wall_s"] for r in quickstart],
        "baseline_gain": baseline["gain"],
        "target_gain": TARGET_GAIN,
        "target_s": TARGET_S,
        "met": all(r["gain"] >= TARGET_GAIN and r["run_s"] <= TARGET_S for r in quickstart),
    }
    print(json.dumps(summary))
    return 0 if summary["met"] else 1
