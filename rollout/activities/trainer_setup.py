"""Trainer activities from `trainer.*` settings: the local provider (torch + peft) or Tinker's API, with the
bridges that convert and publish each checkpoint.

Contract: `trainer_activities` checks the settings before it builds anything heavy and raises
`TrainerSetupError` with a message that says what to set (Tinker needs its model name and a LoRA rank). The
model of the local provider is resolved (converted or built once) into `models_dir`, and so is the model of
a policy on a base model of its own, when its first step asks for it. Each trainer process
keeps its scratch files under `scratch`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.activities.bridges import BridgeActivities
from rollout.activities.local_training import LocalProvider
from rollout.activities.tinker_training import TinkerProvider, TinkerTrainerConfig
from rollout.activities.training import TrainingActivities
from rollout.blobs import BlobStore
from rollout.config import TrainerProvider, TrainerSettings, loss_config
from rollout.ledger import Ledger

if TYPE_CHECKING:
    from rollout.training.local import TrainerBuilder


class TrainerSetupError(ValueError):
    """The trainer settings cannot train; the message says what to set."""


@dataclass(frozen=True)
class TrainerWorkerActivities:
    training: TrainingActivities
    bridges: BridgeActivities
    describe: str  # what it trains, for the worker's start line


def check_trainer_settings(spec: TrainerSettings) -> None:
    if spec.data_parallel_workers < 1:
        raise TrainerSetupError(
            "trainer.data_parallel_workers is how many workers train each step: 1 or more"
        )
    if spec.data_parallel_workers > 1 and spec.provider != TrainerProvider.local:
        raise TrainerSetupError(
            "trainer.data_parallel_workers applies to the local trainer; Tinker spreads its own training"
        )
    if spec.updates_per_batch < 1:
        raise TrainerSetupError(
            "trainer.updates_per_batch is how many optimiser steps each batch takes: 1 or more"
        )
    if spec.updates_per_batch > 1 and spec.provider != TrainerProvider.local:
        raise TrainerSetupError(
            "trainer.updates_per_batch applies to the local trainer; with Tinker each batch takes one step"
        )
    if spec.provider == TrainerProvider.tinker and (not spec.tinker_base_model or not spec.lora_rank):
        raise TrainerSetupError(
            "trainer.provider=tinker needs trainer.tinker_base_model=NAME (Tinker's name of the model, e.g. "
            "Qwen/Qwen3-8B) and a LoRA rank (trainer.lora_rank=32): Tinker trains LoRA adapters"
        )


def trainer_activities(
    spec: TrainerSettings,
    ledger: Ledger,
    store: BlobStore,
    *,
    model_path: str | None,
    holder: str,
    scratch: Path,
    resolve: Callable[[str], str] | None = None,
    serving_key: bytes | None = None,
) -> TrainerWorkerActivities:
    """The activities a trainer worker registers. `model_path` is the resolved `spec.model` (local
    provider); `resolve` resolves the model of a policy on a model of its own the same way; `serving_key`
    signs the serving targets it publishes."""
    check_trainer_settings(spec)
    if spec.provider == TrainerProvider.tinker:
        assert spec.tinker_base_model is not None  # checked above
        config = TinkerTrainerConfig(
            base_model=spec.tinker_base_model,
            lora_rank=spec.lora_rank,
            learning_rate=spec.learning_rate,
            max_grad_norm=spec.max_grad_norm,
            base_url=spec.tinker_url,
        )
        tinker = TinkerProvider(
            ledger,
            store,
            config=config,
            loss=loss_config(spec),
            scratch=scratch,
        )
        training = TrainingActivities(ledger, store, tinker, holder=holder, lease_ttl_s=spec.lease_ttl_s)
        return TrainerWorkerActivities(
            training=training,
            bridges=BridgeActivities(
                ledger, store, base_model=None, scratch=scratch, serving_key=serving_key
            ),
            describe=f"{spec.tinker_base_model} on Tinker ({spec.loss})",
        )
    if model_path is None:
        raise TrainerSetupError("the local trainer needs the model's path (resolve trainer.model first)")
    from rollout.training.local import LocalTrainerConfig

    local = LocalTrainerConfig(
        lora_rank=spec.lora_rank or None,
        lora_alpha=spec.lora_alpha,
        learning_rate=spec.learning_rate,
        max_grad_norm=spec.max_grad_norm,
        micro_batch_tokens=spec.micro_batch_tokens,
        updates_per_batch=spec.updates_per_batch,
        device=spec.device,
        quantization=spec.quantization,
        seed=spec.seed,
    )
    provider = LocalProvider(
        ledger,
        store,
        model_path=model_path,
        config=local,
        loss=loss_config(spec),
        holder=holder,
        scratch=scratch,
        gpu_lease=spec.gpu_lease,
        builder=_builder(spec),
        resolve=resolve,
    )
    training = TrainingActivities(ledger, store, provider, holder=holder, lease_ttl_s=spec.lease_ttl_s)
    workers = (
        f", data-parallel on {spec.data_parallel_workers} Ray workers"
        if spec.data_parallel_workers > 1
        else ""
    )
    return TrainerWorkerActivities(
        training=training,
        bridges=BridgeActivities(
            ledger,
            store,
            base_model=model_path,
            scratch=scratch,
            model=spec.model,
            resolve=resolve,
            serving_key=serving_key,
        ),
        describe=f"{spec.model} ({spec.loss}{workers})",
    )


def _builder(spec: TrainerSettings) -> TrainerBuilder | None:
    if spec.data_parallel_workers == 1:
        return None
    from rollout.training.data_parallel import DataParallel

    on_cuda = (spec.device or "").startswith("cuda")  # each worker asks Ray for a GPU of its own
    return DataParallel(
        spec.data_parallel_workers, gpus_per_worker=1.0 if on_cuda else 0.0, address=spec.ray_address
    )
