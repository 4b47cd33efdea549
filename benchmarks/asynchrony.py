"""`uv run python -m benchmarks async`: training steps per hour and reward at equal steps, max_lag 0 against 2
and 4.

Everything is real and local, each its own process on this machine: Postgres and the Temporal dev server
(embedded stack), the local engine (tiny-qwen3, `cpu-micro`'s random-weight model, with its serving follower),
`rollout gateway`, one `rollout worker runner` and one `rollout worker trainer` (LoRA rank 4). The environment
is `benchmarks.heavytail` (chains of arithmetic questions whose lengths are heavy-tailed, 50 ms of "tool" time
per answer).

The three runs differ only in max_lag: the same engine, trainer and runner, the same groups in flight (at most
`GROUPS_IN_FLIGHT`), the same batch (`GROUPS_PER_BATCH` whole groups per step), the same number of steps.
- max_lag 0 is synchronous: a batch of groups plays, is trained on, and the next batch starts once its
  checkpoint exists, its turns on that checkpoint only.
- max_lag 2 and 4: the supply runs up to max_lag batches ahead of training and turns may use a checkpoint up
  to max_lag behind the newest, so sampling goes on while the trainer trains and no step waits for the longest
  episode of its batch.
Steps per hour: steps / (last checkpoint's time − the run's creation), from the ledger's clock. Reward at
equal steps: the mean over all steps of each batch's mean reward. A warm-up run (one step) goes first and is
not counted. A plot of steps done against time goes to `benchmarks/async.png`. Target (issue 5): >= 1.8x steps
per hour at max_lag 4 against max_lag 0, with no worse reward (within two standard errors of the step-to-step
noise).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

GROUPS_PER_BATCH = 2
GROUPS_IN_FLIGHT = 4
MAX_TOKENS = 8
ENVIRONMENT = "benchmarks.heavytail:environment"
PLOT = Path(__file__).with_name("async.png")


async def _train(
    client: Any, ledger: Any, queue: str, trainer_queue: str, max_lag: int, steps: int
) -> dict[str, Any]:
    from rollout.ledger import Kind
    from rollout.ledger.streams import policy_checkpoints_stream, run_batches_stream, run_stream
    from rollout.run.settings import RunSettings
    from rollout.workflows.names import run_policy, run_workflow_id
    from rollout.workflows.run import RunWorkflow
    from rollout.workflows.run_types import RunInput
    from rollout.workflows.training_types import TrainingSpec

    run = f"async-lag{max_lag}-{uuid.uuid4().hex[:6]}"
    given = RunInput(
        run,
        ENVIRONMENT,
        groups_in_flight=GROUPS_IN_FLIGHT,
        settings=RunSettings(max_lag=max_lag, max_tokens=MAX_TOKENS),
        training=TrainingSpec(
            steps, groups_per_batch=GROUPS_PER_BATCH, wait_s=0.2, served_wait_s=120, task_queue=trainer_queue
        ),
    )
    status = await client.execute_workflow(RunWorkflow.run, given, id=run_workflow_id(run), task_queue=queue)
    created = [
        e
        for e in await ledger.read(policy_checkpoints_stream(run_policy(run, "default")))
        if e.kind == Kind.CHECKPOINT_CREATED
    ]
    began = next(e for e in await ledger.read(run_stream(run)) if e.kind == Kind.RUN_CREATED).recorded_at
    assert len(created) == steps, f"{run}: {len(created)} checkpoints for {steps} steps ({status})"
    wall_s = (created[-1].recorded_at - began).total_seconds()
    metrics = [e.payload["metrics"] for e in created]
    # Where a step's time goes: waiting for its batch (since the previous checkpoint) and training it.
    batched = {
        e.key: e.recorded_at
        for e in await ledger.read(run_batches_stream(run, run_policy(run, "default")))
        if e.kind == Kind.BATCH_ASSEMBLED
    }
    trained_at = [began] + [e.recorded_at for e in created]
    waits = [(batched[f"step/{k}"] - trained_at[k - 1]).total_seconds() for k in range(1, steps + 1)]
    trains = [(trained_at[k] - batched[f"step/{k}"]).total_seconds() for k in range(1, steps + 1)]
    return {
        "max_lag": max_lag,
        "steps": steps,
        "wall_s": round(wall_s, 1),
        "steps_per_hour": round(steps * 3600 / wall_s, 1),
        "reward_mean": round(statistics.mean(m["reward_mean"] for m in metrics), 4),
        "reward_by_step": [round(m["reward_mean"], 4) for m in metrics],
        "staleness_mean": round(statistics.mean(m.get("staleness_mean", 0.0) for m in metrics), 3),
        "staleness_max": max(m.get("staleness_max", 0.0) for m in metrics),
        "episodes": status.episodes_finished,
        "minutes_by_step": [round((t - began).total_seconds() / 60, 2) for t in trained_at[1:]],
        "batch_wait_s_mean": round(statistics.mean(waits), 1),
        "train_s_mean": round(statistics.mean(trains), 1),
    }


async def measure(settings: Any, queue: str, trainer_queue: str, steps: int) -> list[dict[str, Any]]:
    from temporalio.client import Client

    from rollout.ledger import Ledger

    client = await Client.connect(settings.temporal_address)
    async with await Ledger.connect(settings.ledger_url) as ledger:
        await _train(client, ledger, queue, trainer_queue, 4, 1)  # warm: model loads, imports, connections
        results = []
        for max_lag in (0, 2, 4):
            result = await _train(client, ledger, queue, trainer_queue, max_lag, steps)
            print(f"max_lag {max_lag}: {result}", file=sys.stderr, flush=True)
            results.append(result)
    return results


def _plot(results: list[dict[str, Any]]) -> None:
    """Steps done against wall time, one line per max_lag (`benchmarks/async.png`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5), dpi=120)
    for result in results:
        minutes = [0.0, *result["minutes_by_step"]]
        axis.step(
            minutes,
            range(len(minutes)),
            where="post",
            label=f"max_lag {result['max_lag']}: {result['steps_per_hour']:.0f} steps/h",
        )
    axis.set_xlabel("minutes since the run started")
    axis.set_ylabel("training steps done")
    axis.set_title(f"{ENVIRONMENT}, {GROUPS_PER_BATCH} groups per step, {os.cpu_count()} CPUs", fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(PLOT)
    plt.close(figure)


def _no_worse(rewards: list[float], baseline: list[float]) -> bool:
    """Mean reward not below the baseline's by more than two standard errors of the difference (step
    noise)."""
    if len(rewards) < 2 or len(baseline) < 2:
        return statistics.mean(rewards) >= statistics.mean(baseline)
    error = (
        statistics.variance(rewards) / len(rewards) + statistics.variance(baseline) / len(baseline)
    ) ** 0.5
    return statistics.mean(rewards) >= statistics.mean(baseline) - 2 * error


def main(quick: bool = False) -> int:
    from benchmarks.stack import bench_stack
    from rollout.engines.models import TINY_QWEN3, resolve
    from rollout_testing.cluster import Cluster

    models_dir = Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )
    resolve(TINY_QWEN3, models_dir)
    steps = 2 if quick else 40
    with (
        tempfile.TemporaryDirectory(prefix="rollout-bench-async-") as scratch,
        bench_stack(Path(scratch)) as bench,
    ):
        settings = bench.settings
        cluster = Cluster(
            settings=settings, root=Path(scratch) / "cluster", models_dir=models_dir, task_queue="bench-async"
        )
        trainer_queue = f"{cluster.task_queue}-trainer"
        try:
            _, engine_url = cluster.local_engine("engine-bench")
            cluster.runner("runner-1", cluster.gateway(engine_url))
            cluster.trainer("trainer-1", trainer_queue)
            results = asyncio.run(measure(settings, cluster.task_queue, trainer_queue, steps))
        finally:
            cluster.close()
    if not quick:
        _plot(results)
    by_lag = {r["max_lag"]: r for r in results}
    sync, lag4 = by_lag[0], by_lag[4]
    speedup = lag4["steps_per_hour"] / sync["steps_per_hour"]
    summary = {
        "benchmark": "async",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
        "environment": ENVIRONMENT,
        "steps": steps,
        "groups_per_batch": GROUPS_PER_BATCH,
        "groups_in_flight": GROUPS_IN_FLIGHT,
        **{
            f"lag{lag}_{k}": v
            for lag, r in by_lag.items()
            for k, v in r.items()
            if k not in ("max_lag", "steps")
        },
        "speedup_lag2": round(by_lag[2]["steps_per_hour"] / sync["steps_per_hour"], 2),
        "speedup_lag4": round(speedup, 2),
        "target_1_8x_met": speedup >= 1.8,
        "reward_difference_lag4": round(lag4["reward_mean"] - sync["reward_mean"], 4),
        "reward_no_worse": _no_worse(lag4["reward_by_step"], sync["reward_by_step"]),
    }
    print(json.dumps(summary))
    return 0
