"""`uv run python -m benchmarks learning`: does `cpu-tiny` learn `arithmetic` on this machine, and how fast?

It runs the user's command, `rollout train arithmetic.environment:environment --preset cpu-tiny`
(SmolLM2-135M- Instruct, LoRA rank 8, on CPU; every service its own process on an embedded stack in a scratch
directory), until `BUDGET_S` (30 minutes) has passed (`STEPS` is more than that allows); at the budget it
interrupts the command the way a user would (Ctrl-C pauses the run). The reward curve is read from the ledger:
each step's batch mean reward, with the time it was trained (`CheckpointCreated` metrics), and the steps
skipped for having no signal (every group's rewards equal: `BatchAssembled` with no sampled token) with
theirs, so every episode played counts.

Result: the mean reward of the first `WINDOW` batches against the last `WINDOW` (10 batches, 80 episodes: a
single batch swings between 0.1 and 0.5 once exact answers appear), and a plot of the curve
(`benchmarks/learning.png`). Target (issue 5): up by >= 0.2 absolute. `--quick` runs `cpu-micro` for 2 steps
(it checks the benchmark works; a random-weight model learns nothing).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.stack import models_dir, train_stack

if TYPE_CHECKING:
    from rollout.config import Settings

BUDGET_S = 30 * 60
QUICK_BUDGET_S = 5 * 60
WINDOW = 10
STEPS = 10_000  # more than the budget allows: the run ends at the budget
PLOT = Path(__file__).with_name("learning.png")


def _train(
    overrides: list[str], preset: str, run: str, steps: int, log: Path, budget_s: float
) -> tuple[int | None, float]:
    """The CLI, until it finishes or the budget is spent (then Ctrl-C). Its exit code (None: interrupted)."""
    command = [
        sys.executable,
        "-m",
        "rollout.cli",
        "train",
        "arithmetic.environment:environment",
        "--preset",
        preset,
        "--run",
        run,
        "--json",
        f"trainer.steps={steps}",
        *overrides,
    ]
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # A shell starts a background job with SIGINT ignored, and children inherit that: restore Ctrl-C.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            return process.wait(timeout=budget_s), time.monotonic() - started
        except subprocess.TimeoutExpired:
            wall_s = time.monotonic() - started
            process.send_signal(signal.SIGINT)  # the user's Ctrl-C: the run pauses
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:  # the pause hangs: the stack is shut down after all the same
                process.kill()
                process.wait()
            return None, wall_s


async def _curve(ledger_url: str, run: str, *, skipped: bool = False) -> list[dict[str, Any]]:
    """Each trained step's batch mean reward, its time since the run was created (`minutes`), its wall-clock
    time (`at`, epoch seconds) and all its checkpoint's `metrics`. `skipped`: also the steps whose every group
    had no signal (no checkpoint, `trained` false, `metrics` empty), at the time their batch was assembled."""
    from rollout.ledger import Kind, Ledger
    from rollout.ledger.streams import policy_checkpoints_stream, run_batches_stream, run_stream
    from rollout.workflows.names import run_policy

    policy = run_policy(run, "default")
    async with await Ledger.connect(ledger_url) as ledger:
        began = next(e for e in await ledger.read(run_stream(run)) if e.kind == Kind.RUN_CREATED).recorded_at
        points = [
            (
                int(e.payload["version"]),
                e.recorded_at,
                float(e.payload["metrics"]["reward_mean"]),
                True,
                dict(e.payload["metrics"]),
            )
            for e in await ledger.read(policy_checkpoints_stream(policy), limit=100000)
            if e.kind == Kind.CHECKPOINT_CREATED
        ]
        if skipped:
            points += [
                (int(e.payload["step"]), e.recorded_at, float(e.payload["reward_mean"]), False, {})
                for e in await ledger.read(run_batches_stream(run, policy), limit=100000)
                if e.kind == Kind.BATCH_ASSEMBLED and int(e.payload["sampled_tokens"]) == 0
            ]
    return [
        {
            "step": step,
            "minutes": (at - began).total_seconds() / 60,
            "at": at.timestamp(),
            "reward": reward,
            "trained": trained,
            "metrics": metrics,
        }
        for step, at, reward, trained, metrics in sorted(points, key=lambda p: p[0])
    ]


def _plot(curve: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in curve]
    rewards = [p["reward"] for p in curve]
    smoothed = [statistics.mean(rewards[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(rewards))]
    figure, axis = plt.subplots(figsize=(7, 3.5), dpi=120)
    axis.plot(steps, rewards, ".", color="tab:blue", alpha=0.5, label="batch mean reward")
    axis.plot(steps, smoothed, "-", color="tab:blue", label=f"mean of last {WINDOW} steps")
    axis.set_xlabel("training step")
    axis.set_ylabel("reward")
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(PLOT)
    plt.close(figure)


@dataclass(frozen=True)
class Trained:
    """A `rollout train` on an embedded stack: its exit code (None: interrupted at the budget), when it
    started (epoch seconds), how long it ran, its reward curve (see `_curve`), its settings and the tail of
    its output."""

    exit_code: int | None
    started_at: float
    wall_s: float
    curve: list[dict[str, Any]]
    settings: Settings
    log_tail: str


def train_on_stack(
    preset: str,
    steps: int,
    budget_s: float,
    name: str,
    *,
    skipped: bool = False,
    overrides: Sequence[str] = (),
) -> Trained:
    """`rollout train arithmetic.environment:environment --preset PRESET` on a stack (benchmarks.stack:
    `train_stack`, its own in a scratch directory unless one is given), for `steps` steps or until `budget_s`
    has passed (then Ctrl-C). `overrides` are more settings for the command (`run.max_lag=8`,
    `trainer.loss=truncated_is`)."""
    from rollout import config

    run = f"{name}-{uuid.uuid4().hex[:6]}"
    with (
        tempfile.TemporaryDirectory(prefix=f"rollout-bench-{name}-", ignore_cleanup_errors=True) as scratch,
        train_stack(Path(scratch) / "data") as stack,
    ):
        settings = config.load([f"preset={preset}", *stack, *overrides])
        log = Path(scratch) / "train.log"
        started_at = time.time()
        exit_code, wall_s = _train([*stack, *overrides], preset, run, steps, log, budget_s)
        # A command that failed may have started no run: its callers say so, with its output.
        failed = exit_code not in (None, 0)
        curve = [] if failed else asyncio.run(_curve(settings.ledger_url, run, skipped=skipped))
        return Trained(
            exit_code, started_at, wall_s, curve, settings, log.read_text(errors="replace")[-3000:]
        )


def main(quick: bool = False) -> int:
    from rollout.engines.models import SMOLLM2, TINY_QWEN3, resolve

    preset, steps = ("cpu-micro", 2) if quick else ("cpu-tiny", STEPS)
    resolve(TINY_QWEN3 if quick else SMOLLM2, models_dir())
    trained = train_on_stack(preset, steps, QUICK_BUDGET_S if quick else BUDGET_S, "learning", skipped=True)
    exit_code, wall_s, curve, settings = trained.exit_code, trained.wall_s, trained.curve, trained.settings
    if exit_code not in (None, 0) or not curve or (quick and exit_code is None):
        print(trained.log_tail, file=sys.stderr)
        raise SystemExit(f"rollout train failed (exit {exit_code}); its output is above")
    rewards = [p["reward"] for p in curve]
    window = min(WINDOW, max(1, len(rewards) // 2))
    first, last = statistics.mean(rewards[:window]), statistics.mean(rewards[-window:])
    if not quick:
        _plot(
            curve,
            f"cpu-tiny on arithmetic ({settings.trainer.model}, LoRA r={settings.trainer.lora_rank}, "
            f"{os.cpu_count()} CPUs): {len(curve)} steps in {wall_s / 60:.1f} min",
        )
    summary = {
        "benchmark": "learning",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
        "preset": preset,
        "model": settings.trainer.model,
        "steps": len(curve),
        "skipped": sum(1 for p in curve if not p["trained"]),
        "finished": exit_code == 0,
        "wall_minutes": round(wall_s / 60, 1),
        "minutes_per_step": round(curve[-1]["minutes"] / len(curve), 2),
        "window": window,
        "reward_first": round(first, 4),
        "reward_last": round(last, 4),
        "reward_gain": round(last - first, 4),
        "reward_by_step": [round(r, 3) for r in rewards],
        "plot": str(PLOT) if not quick else None,
        "target_0_2_met": last - first >= 0.2,
    }
    print(json.dumps(summary))
    return 0
