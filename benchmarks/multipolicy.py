"""`uv run python -m benchmarks multipolicy`: what a second base model costs a two-policy run.

It trains the shipped two-policy game twice, each time with `rollout train … --preset cpu-quickstart` on an
embedded stack of its own in a scratch directory (every service its own process, the models converted
beforehand):

- baseline: `signals.environment:environment`, both policies LoRA lineages of SmolLM2-135M-Instruct, served
  by the stack's one engine;
- two models: `signals.environment:two_models`, the speaker on tiny-qwen3 (an engine of its own, which
  `rollout train` starts) and the listener on SmolLM2.

For each it reports episodes per second while the run plays (episodes finished, over the time from the run's
start line to the end of the command) and the memory of the stack's processes (the proportional set size of
each service and its children, sampled every half second; the peak of their sum, and each service's peak).
The difference is what the second model costs: its engine's memory, its trainer's, and the episodes per
second it takes. The last line printed is one JSON object. `--quick` checks that it works: `cpu-micro` (the
baseline's policies on the tiny random model) for 2 steps each; on a stack it shares (benchmarks.stack), the
memory is the whole stack's.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from benchmarks.stack import models_dir, train_stack
from rollout.stack.processes import read_pid_file

STEPS = 6
RUNS = {
    "one model": "signals.environment:environment",
    "two models": "signals.environment:two_models",
}
SAMPLE_S = 0.5


def _tree(pid: int) -> list[psutil.Process]:
    """Process `pid` and its children (none once it is gone)."""
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def _proportional(process: psutil.Process) -> int:
    """Its proportional set size: what it holds alone, plus its share of what it shares (libraries), so the
    sum over processes counts each page once."""
    try:
        return process.memory_full_info().pss
    except psutil.Error:
        return 0


class MemorySampler:
    """Samples the resident memory of each service of a stack (its data directory's `run/*.pid` files)."""

    def __init__(self, data: Path) -> None:
        self.run_dir = data / "run"
        self.peak_total = 0
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            now: dict[str, int] = {}
            for pid_file in self.run_dir.glob("*.pid") if self.run_dir.is_dir() else ():
                # The supervisor's children are the services, each counted under its own name.
                if pid_file.stem != "supervisor" and (record := read_pid_file(pid_file)) is not None:
                    now[pid_file.stem] = sum(_proportional(p) for p in _tree(record.pid))
            self.peak_total = max(self.peak_total, sum(now.values()))
            for name, size in now.items():
                self.peak[name] = max(self.peak.get(name, 0), size)


def one_run(environment: str, preset: str, steps: int, scratch: Path) -> dict[str, Any]:
    """One `rollout train ENV --json` on a stack (benchmarks.stack: `train_stack`, its own unless one is
    given): episodes per second while it played, memory."""
    from rollout import config

    run = f"bench-{uuid.uuid4().hex[:6]}"
    started_line = f"run {run}: training"  # `rollout train`'s line once the run has started
    with train_stack(scratch / "data") as overrides:
        command = [
            *(sys.executable, "-m", "rollout.cli", "train", environment, "--preset", preset),
            *(f"trainer.steps={steps}", "--run", run, "--json", *overrides),
        ]
        started = time.monotonic()
        run_started: float | None = None
        errors: list[str] = []
        with MemorySampler(config.load(overrides).data_path) as memory:
            train = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert train.stderr is not None and train.stdout is not None
            for line in train.stderr:
                errors.append(line)
                if run_started is None and started_line in line:
                    run_started = time.monotonic()
            output = train.stdout.read()
            train.wait(timeout=3600)
            ended = time.monotonic()
    if train.returncode != 0 or run_started is None:
        raise RuntimeError(f"rollout train failed ({train.returncode}):\n{''.join(errors)[-3000:]}")
    summary = json.loads(output.strip().splitlines()[-1])
    policies = summary.get("policies", [summary])
    episodes = summary["episodes"]
    return {
        "wall_s": round(ended - started, 1),
        "stack_start_s": round(run_started - started, 1),
        "playing_s": round(ended - run_started, 1),
        "episodes": episodes,
        "episodes_per_s": round(episodes / (ended - run_started), 3),
        "steps": {p["policy"].rpartition("/")[2]: p["steps"] for p in policies},
        "peak_pss_mib": round(memory.peak_total / 2**20),
        "peak_pss_mib_by_service": {k: round(v / 2**20) for k, v in sorted(memory.peak.items())},
    }


def main(quick: bool = False) -> int:
    from rollout.engines.models import SMOLLM2, TINY_QWEN3, resolve

    for model in (SMOLLM2, TINY_QWEN3):
        resolve(model, models_dir())  # converted once, before any clock starts
    preset, steps = ("cpu-micro", 2) if quick else ("cpu-quickstart", STEPS)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rollout-bench-multipolicy-") as scratch:
        for name, environment in RUNS.items():
            results[name] = one_run(environment, preset, steps, Path(scratch) / name.replace(" ", "-"))
            print(json.dumps({"run": name, "environment": environment} | results[name]), flush=True)
    one, two = results["one model"], results["two models"]
    summary = {
        "benchmark": "multipolicy",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "steps": steps,
        "episodes_per_s": {"one model": one["episodes_per_s"], "two models": two["episodes_per_s"]},
        "peak_pss_mib": {"one model": one["peak_pss_mib"], "two models": two["peak_pss_mib"]},
        "second_model_pss_mib": two["peak_pss_mib"] - one["peak_pss_mib"],
        "second_model_throughput": round(two["episodes_per_s"] / one["episodes_per_s"], 3),
        "stack_start_s": {"one model": one["stack_start_s"], "two models": two["stack_start_s"]},
    }
    print(json.dumps(summary))
    return 0
