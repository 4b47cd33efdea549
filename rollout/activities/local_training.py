"""The local training provider: one trainer in memory per policy (a `LocalTrainer`, or with
`builder=DataParallel(...)` a group of them training data-parallel on Ray workers), for
rollout.activities.training's protocol.

Contract:
- A step brings the policy's trainer to `parent` (the checkpoint in memory, or resumed from the blob store, or
  the base model: the policy's own, `TrainStepInput.model`, built with its own LoRA rank and learning rate,
  else the provider's), trains on the batch, saves, and publishes through the protocol's `Publish`; the
  trainer is then kept at the published checkpoint. A loss or gradient that is not finite raises
  `NonFiniteLoss` before any weight changes.
- One-GPU mode (`gpu_lease`): the step claims the ledger lease `gpu/{gpu}`, waits until every engine acking
  that GPU sleeps (or fails the attempt, retryably, after `ENGINES_ASLEEP_S`), builds or onloads its trainer,
  trains, saves and publishes, offloads the trainer to CPU memory, then releases the lease; the engines wake
  to the new checkpoint. The lease's TTL (`GPU_LEASE_TTL_S`) bounds a step: it is not renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollout.activities.training import Publish, parent_record
from rollout.blobs import BlobStore
from rollout.ledger import Ledger
from rollout.ledger.streams import gpu_lease
from rollout.records.checkpoints import CheckpointRecord
from rollout.rl.batches import Batch
from rollout.rl.losses import LossConfig
from rollout.serving.states import EngineStates
from rollout.training.checkpoints import fetch_checkpoint
from rollout.training.local import LocalTrainerConfig, OneProcess, Trainer, TrainerBuilder
from rollout.workflows.training_types import PolicyModel, TrainStepInput

GPU_LEASE_TTL_S = 1800.0
ENGINES_ASLEEP_S = 120.0


class LocalProvider:
    def __init__(
        self,
        ledger: Ledger,
        store: BlobStore,
        *,
        model_path: str,
        config: LocalTrainerConfig,
        loss: LossConfig,
        holder: str,
        scratch: Path | None = None,
        gpu_lease: str | None = None,
        builder: TrainerBuilder | None = None,
        resolve: Callable[[str], str] | None = None,
    ) -> None:
        self.ledger, self.store = ledger, store
        self.model_path, self.config, self.loss = model_path, config, loss
        self.resolve = resolve  # a policy's own model spec -> its local path (converted or built once)
        self.holder = holder  # of the GPU's lease, in one-GPU mode
        self.scratch = scratch or Path(tempfile.mkdtemp(prefix="rollout-trainer-"))
        self.builder = builder or OneProcess()  # in this process, or data-parallel across Ray workers
        self.trainers: dict[str, tuple[Trainer, str | None]] = {}  # policy -> (trainer, checkpoint it is at)
        self.gpu_lease = gpu_lease
        self._torch_lock = threading.Lock()

    def forget(self, policy: str) -> None:
        self.trainers.pop(policy, None)

    async def step(self, given: TrainStepInput, batch: Batch, publish: Publish) -> CheckpointRecord:
        # One-GPU mode: the trainer is built (or brought back from CPU memory) only once the device is ours,
        # and holds it until the checkpoint is published, so the engines wake to it.
        async with (
            self._gpu(),
            self._on_device(await self._trainer_at(given)) as trainer,
        ):
            metrics = await asyncio.to_thread(self._one_at_a_time, trainer.step, batch)
            directory = self.scratch / given.policy / f"step-{given.step:06d}"
            await asyncio.to_thread(trainer.save, directory)
            record = await publish(directory, metrics)
        self.trainers[given.policy] = (trainer, record.name)
        return record

    @contextlib.asynccontextmanager
    async def _gpu(self) -> AsyncIterator[None]:
        """One-GPU mode: hold the GPU's lease, and go on only once every engine on that GPU sleeps (an engine
        that does not within `ENGINES_ASLEEP_S` fails the attempt, retryably, with the lease let go)."""
        if self.gpu_lease is None:
            yield
            return
        resource = gpu_lease(self.gpu_lease)
        while (lease := await self.ledger.claim(resource, self.holder, GPU_LEASE_TTL_S)) is None:
            activity.heartbeat()
            await asyncio.sleep(1.0)
        try:
            if not await engines_asleep(self.ledger, self.gpu_lease, timeout_s=ENGINES_ASLEEP_S):
                raise ApplicationError(
                    f"the engines on GPU {self.gpu_lease!r} did not go to sleep within {ENGINES_ASLEEP_S:.0f} s "
                    "(is each one's follower running, with sleep mode on?); the step is tried again"
                )
            yield
        finally:
            await self.ledger.release(lease)

    @contextlib.asynccontextmanager
    async def _on_device(self, trainer: Trainer) -> AsyncIterator[Trainer]:
        """One-GPU mode: the trainer's weights and optimiser state are on the device for the step, and wait in
        CPU memory between steps."""
        if self.gpu_lease is None:
            yield trainer
            return
        await asyncio.to_thread(self._one_at_a_time, trainer.onload)
        try:
            yield trainer
        finally:
            await asyncio.to_thread(self._one_at_a_time, trainer.offload)

    async def _trainer_at(self, given: TrainStepInput) -> Trainer:
        policy, parent = given.policy, given.parent
        if policy in self.trainers and self.trainers[policy][1] == parent:
            return self.trainers[policy][0]
        config = self._config_of(given.model)
        if parent is None:
            model_path = await asyncio.to_thread(self._model_path_of, given.model)
            return await asyncio.to_thread(
                self._one_at_a_time, self.builder.build, model_path, config, self.loss
            )
        record = await parent_record(self.ledger, policy, parent)
        directory = await asyncio.to_thread(
            fetch_checkpoint, self.store, record, self.scratch / policy / f"fetched-{parent}"
        )
        return await asyncio.to_thread(self._one_at_a_time, self.builder.resume, directory, config, self.loss)

    def _config_of(self, own: PolicyModel | None) -> LocalTrainerConfig:
        """The trainer's settings, with those the policy sets for itself."""
        if own is None:
            return self.config
        return replace(
            self.config,
            lora_rank=self.config.lora_rank if own.lora_rank is None else own.lora_rank or None,
            learning_rate=self.config.learning_rate if own.learning_rate is None else own.learning_rate,
        )

    def _model_path_of(self, own: PolicyModel | None) -> str:
        if own is None:
            return self.model_path
        if self.resolve is None:
            raise ApplicationError(
                f"this trainer trains one model, not {own.model}: start it with a model resolver",
                non_retryable=True,
            )
        return self.resolve(own.model)

    def _one_at_a_time[**P, T](self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Model building and training run in threads; a cancelled attempt's thread runs on, so a retry in the
        same process must wait for it (transformers cannot build two models at once in one process)."""
        with self._torch_lock:
            return work(*args, **kwargs)


async def engines_asleep(ledger: Ledger, gpu: str, *, timeout_s: float) -> bool:
    """Wait until every engine whose newest ack gives way to `gpu` sleeps (False if the time ran out)."""
    deadline = time.monotonic() + timeout_s
    states = EngineStates()
    while True:
        await states.refresh(ledger)
        if all(ack.sleeping for ack in states.values() if ack.gpu == gpu) or time.monotonic() > deadline:
            return time.monotonic() <= deadline
        activity.heartbeat()
        await asyncio.sleep(0.5)
