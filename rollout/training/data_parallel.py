"""A trainer that trains each step data-parallel across Ray workers, kept across steps (torch DDP semantics).

Contract:
- `DataParallel(workers, gpus_per_worker, address)` builds `ShardedTrainer`s: `build(model_path, config,
  loss)` from the base model, `resume(directory, config, loss)` from a saved checkpoint, as `LocalTrainer` and
  `LocalTrainer.resume` do; the trainer worker's activities take either (`trainer.data_parallel_workers`).
- A `ShardedTrainer` is `workers` Ray actors (`TrainerShard`), each asking Ray for one CPU and
  `gpus_per_worker` GPUs, joined in one torch.distributed group (gloo on CPU, NCCL on CUDA) and each holding a
  `LocalTrainer` built alike. `step(batch)` gives every shard the batch; shard r trains the r-th run of its
  segments sorted by their ids, with the gradients summed across shards before clipping
  (`LocalTrainer.step(shard=...)`), so every shard makes the update one process would make on the whole
  batch, and the shards stay identical. It returns shard 0's metrics.
- `save(directory)` writes what `LocalTrainer.save` writes, from shard 0 (its files travel through Ray, so the
  shards need no filesystem in common with the caller); `resume` sends a checkpoint's files to every shard.
  The model is loaded by each shard from `model_path`: every node must have it there (a shared volume).
- The group lives while the `ShardedTrainer` is referenced: dropping it (or `close`) ends the actors. A shard
  that dies fails the step that was running; the next step builds a new group from the last checkpoint (the
  activities drop a trainer whose step failed).
- Ray is an optional extra (`uv sync --extra ray`); without it `DataParallelUnavailable` says how to install
  it.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.rl.batches import Batch
from rollout.rl.losses import LossConfig
from rollout.training.local import TRAINER_STATE, LocalTrainer, LocalTrainerConfig

Files = dict[str, bytes]  # a checkpoint directory's files, by path relative to it


class DataParallelUnavailable(RuntimeError):
    """Ray is not installed here."""


def read_files(directory: Path) -> Files:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def write_files(files: Files, directory: Path) -> None:
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


class TrainerShard:
    """One shard of a `ShardedTrainer` (wrapped by `ray.remote`): a `LocalTrainer` in a torch.distributed
    group."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.trainer: LocalTrainer | None = None
        self.scratch = Path(tempfile.mkdtemp(prefix=f"rollout-shard{rank}-"))

    def rendezvous(self) -> str:
        """Shard 0: the address the group meets at (this node, a free port)."""
        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def build(
        self,
        init_method: str,
        model_path: str,
        config: LocalTrainerConfig,
        loss: LossConfig,
        files: Files | None,
    ) -> int:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = (
                "nccl" if (config.device or "").startswith("cuda") and torch.cuda.is_available() else "gloo"
            )
            dist.init_process_group(backend, init_method=init_method, rank=self.rank, world_size=self.world)
        if files is None:
            self.trainer = LocalTrainer(model_path, config, loss)
        else:
            directory = self.scratch / "resumed"
            write_files(files, directory)
            self.trainer = LocalTrainer.resume(directory, config, loss)
        return self.trainer.steps

    def step(self, batch: Batch) -> dict[str, float]:
        assert self.trainer is not None
        return self.trainer.step(batch, shard=(self.rank, self.world))

    def save(self) -> Files:
        assert self.trainer is not None
        directory = self.scratch / f"step-{self.trainer.steps:06d}"
        self.trainer.save(directory)
        return read_files(directory)

    def offload(self) -> None:
        assert self.trainer is not None
        self.trainer.offload()

    def onload(self) -> None:
        assert self.trainer is not None
        self.trainer.onload()


class ShardedTrainer:
    """`workers` shards training as one (see the module contract)."""

    def __init__(self, ray: Any, shards: list[Any], steps: int) -> None:
        self._ray, self._shards, self.steps = ray, shards, steps

    def _all(self, method: str, *args: Any) -> list[Any]:
        return self._ray.get([getattr(shard, method).remote(*args) for shard in self._shards])

    def step(self, batch: Batch) -> dict[str, float]:
        metrics = self._all("step", self._ray.put(batch))[0]
        self.steps += 1
        return metrics

    def save(self, directory: Path) -> None:
        write_files(self._ray.get(self._shards[0].save.remote()), directory)

    def offload(self) -> None:
        self._all("offload")

    def onload(self) -> None:
        self._all("onload")

    def close(self) -> None:
        for shard in self._shards:
            self._ray.kill(shard)
        self._shards = []


@dataclass(frozen=True)
class DataParallel:
    """Builds `ShardedTrainer`s of `workers` shards on the Ray cluster at `address` (None: RAY_ADDRESS, else a
    local one)."""

    workers: int
    gpus_per_worker: float = 0.0
    address: str | None = None

    def build(self, model_path: str, config: LocalTrainerConfig, loss: LossConfig) -> ShardedTrainer:
        return self._group(model_path, config, loss, None)

    def resume(self, directory: Path, config: LocalTrainerConfig, loss: LossConfig) -> ShardedTrainer:
        state = json.loads((directory / TRAINER_STATE).read_text())
        return self._group(str(state["model_path"]), config, loss, read_files(directory))

    def _group(
        self, model_path: str, config: LocalTrainerConfig, loss: LossConfig, files: Files | None
    ) -> ShardedTrainer:
        os.environ.setdefault(
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0"
        )  # the workers' own installation (see ray_command)
        try:
            import ray
        except ImportError:
            raise DataParallelUnavailable(
                "trainer.data_parallel_workers needs Ray: `uv sync --extra ray`"
            ) from None
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS")
            if address:
                ray.init(address=address, configure_logging=False)
            else:  # a local Ray (it refuses start-up options when it joins a running cluster)
                ray.init(include_dashboard=False, configure_logging=False)
        shard_class: Any = ray.remote(num_cpus=1, num_gpus=self.gpus_per_worker)(TrainerShard)
        shards = [shard_class.remote(rank, self.workers) for rank in range(self.workers)]
        init_method = ray.get(shards[0].rendezvous.remote())
        steps = ray.get([s.build.remote(init_method, model_path, config, loss, files) for s in shards])
        return ShardedTrainer(ray, shards, steps[0])
