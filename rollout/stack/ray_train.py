"""placement=ray for the trainer: a step trained data-parallel across Ray workers (Ray Train, torch DDP semantics).

Contract:
- `data_parallel_step(...)` runs one step of `LocalTrainer` on `workers` Ray Train workers (gloo on CPU, NCCL on
  GPUs): each builds the trainer (from the base model, or resumed from `parent`), trains on its shard of the batch
  with the gradients summed across workers (`LocalTrainer.step(shard=...)`), so the update is the one-process
  update; rank 0 saves the checkpoint into `output` (what `LocalTrainer.save` writes, plus the step's metrics
  in `step_metrics.json`), and those metrics come back.
- It needs a Ray cluster (`address`; None: start a local one) with `workers` CPUs, or GPUs with `use_gpu`. Ray is
  an optional extra (`uv sync --extra ray`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollout.stack.ray_actors import RayUnavailable, connect_ray
from rollout.training.batches import Batch
from rollout.training.local import LocalTrainer, LocalTrainerConfig
from rollout.training.losses import LossConfig

STEP_METRICS = "step_metrics.json"  # rank 0's metrics of the step, written beside the checkpoint it saves


def _train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: its shard of the step; rank 0 saves and reports."""
    import ray.train

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    trainer_config: LocalTrainerConfig = config["trainer_config"]
    if config["parent"]:
        trainer = LocalTrainer.resume(Path(config["parent"]), trainer_config, config["loss"])
    else:
        trainer = LocalTrainer(config["model_path"], trainer_config, config["loss"])
    metrics = trainer.step(config["batch"], shard=(rank, world))
    if rank == 0:  # Ray Train keeps metrics only with checkpoints: the step's travel beside its weights
        output = Path(config["output"])
        trainer.save(output)
        (output / STEP_METRICS).write_text(json.dumps({**metrics, "workers": float(world)}))
    ray.train.report(metrics)


def data_parallel_step(
    *,
    model_path: str,
    trainer_config: LocalTrainerConfig,
    loss: LossConfig,
    batch: Batch,
    output: Path,
    workers: int,
    parent: Path | None = None,
    use_gpu: bool = False,
    address: str | None = None,
    storage: Path,
) -> dict[str, float]:
    """Train one step of `batch` on `workers` Ray workers and save the checkpoint into `output` (see contract)."""
    try:
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
    except ImportError:
        raise RayUnavailable("placement=ray needs Ray: `uv sync --extra ray`") from None
    if not ray.is_initialized():
        connect_ray(ray, address)
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={
            "model_path": model_path,
            "trainer_config": trainer_config,
            "loss": loss,
            "batch": batch,
            "output": str(output),
            "parent": str(parent) if parent else None,
        },
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
        run_config=RunConfig(storage_path=str(storage), name=f"step-{output.name}"),
    )
    trainer.fit()
    return {key: float(value) for key, value in json.loads((output / STEP_METRICS).read_text()).items()}
