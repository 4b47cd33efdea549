"""The `tinker` training provider: each step is trained by Tinker's hosted trainer, for
rollout.activities.training's protocol (which holds the lease and publishes, fenced, once per step).

Contract:
- A step: the batch's segments become Datums (`rollout.training.tinker_data`: `target_tokens`, the sampler's
  `logprobs`, `advantages` on sampled tokens only), then `forward_backward` with Tinker's built-in loss
  (`importance_sampling`, `ppo` or `cispo`), then `optim_step` (Adam, gradient clipping) — the optimiser step
  only once the loss came back finite, so a non-finite loss (`NonFiniteLoss`) changes no weights and publishes
  nothing; a batch with no sampled token fails for good (`EmptyBatch`). The diagnostics (ratios, KL, effective
  sample size) come from the logprobs Tinker returns, through the same pure loss code as the local provider.
- The checkpoint lives in Tinker: `save_state` (weights and optimiser: what a resumed or branched step loads
  with `create_training_client_from_state_with_optimizer`) and `save_weights_for_sampler` (what engines
  sample). The published checkpoint's one file, `tinker.json`, names both paths; the `tinker` bridge serves
  the sampler path.
- One training client per policy is kept in memory with the checkpoint it is at; a step from any other parent
  (a retry elsewhere, a branch) loads that parent's state first.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_args

from temporalio.exceptions import ApplicationError

from rollout.activities.training import Publish, parent_record
from rollout.blobs import BlobStore
from rollout.ledger import Ledger
from rollout.records.checkpoints import TINKER_FILE, CheckpointRecord
from rollout.rl.batches import Batch
from rollout.rl.losses import LossConfig, NonFiniteLoss, policy_loss
from rollout.training.checkpoints import checkpoint_name, fetch_checkpoint
from rollout.training.tinker_data import TinkerDatum, loss_function, tinker_datums
from rollout.workflows.training_types import TrainStepInput

if TYPE_CHECKING:
    from tinker import ServiceClient, TrainingClient


@dataclass(frozen=True)
class TinkerTrainerConfig:
    base_model: str
    lora_rank: int = 32
    learning_rate: float = 4e-5
    max_grad_norm: float = 1.0
    base_url: str | None = None  # None: Tinker's hosted API
    api_key: str | None = None  # None: TINKER_API_KEY from the environment


def tinker_paths(directory: Path) -> dict[str, str]:
    """The Tinker paths a published checkpoint names: `state` (weights + optimiser) and `sampler`."""
    return dict(json.loads((directory / TINKER_FILE).read_text()))


class TinkerProvider:
    def __init__(
        self,
        ledger: Ledger,
        store: BlobStore,
        *,
        config: TinkerTrainerConfig,
        loss: LossConfig,
        scratch: Path | None = None,
    ) -> None:
        self.ledger, self.store, self.config, self.loss = ledger, store, config, loss
        self.scratch = scratch or Path(tempfile.mkdtemp(prefix="rollout-tinker-trainer-"))
        # policy -> (client, checkpoint it is at)
        self.clients: dict[str, tuple[TrainingClient, str | None]] = {}
        self._service: ServiceClient | None = None

    def forget(self, policy: str) -> None:
        self.clients.pop(policy, None)

    async def _service_client(self) -> ServiceClient:
        if self._service is None:
            import tinker

            # The SDK opens its session while it is made: off the event loop.
            self._service = await asyncio.to_thread(
                tinker.ServiceClient, base_url=self.config.base_url, api_key=self.config.api_key
            )
        return self._service

    async def step(self, given: TrainStepInput, batch: Batch, publish: Publish) -> CheckpointRecord:
        client = await self._client_at(given.policy, given.parent)
        metrics = await self._train(client, batch, given.step)
        tinker_name = checkpoint_name(given.policy, given.step).replace("/", "-")
        state = await client.save_state(tinker_name).result_async()
        sampler = await client.save_weights_for_sampler(tinker_name).result_async()
        directory = self.scratch / given.policy / f"step-{given.step:06d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / TINKER_FILE).write_text(
            json.dumps({"state": state.path, "sampler": sampler.path, "base_model": self.config.base_model})
        )
        record = await publish(directory, metrics)
        self.clients[given.policy] = (client, record.name)
        return record

    async def _train(self, client: TrainingClient, batch: Batch, step: int) -> dict[str, float]:
        import tinker
        from tinker.types import LossFnType

        datums = tinker_datums(batch)
        if not datums:
            raise ApplicationError(
                "the batch has no sampled token to train on", type="EmptyBatch", non_retryable=True
            )
        loss_name, loss_config = loss_function(self.loss)
        if loss_name not in get_args(LossFnType):  # a loss of a researcher's own, naming one Tinker lacks
            raise ApplicationError(
                f"Tinker has no loss {loss_name!r} (it has {', '.join(get_args(LossFnType))})",
                type="UnknownLoss",
                non_retryable=True,
            )
        data = [to_tinker_datum(d) for d in datums]
        output = await client.forward_backward(
            data, cast("LossFnType", loss_name), loss_config
        ).result_async()
        loss = float(output.metrics.get("loss:sum", float("nan")))
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"step {step}: Tinker's loss is {loss}; no weights were changed")
        adam = tinker.AdamParams(
            learning_rate=self.config.learning_rate, grad_clip_norm=self.config.max_grad_norm
        )
        optimised = await client.optim_step(adam).result_async()
        current = [list(out["logprobs"].tolist()) for out in output.loss_fn_outputs]
        return {
            "loss": loss,
            "tokens": float(batch.sampled_tokens),
            **diagnostics(datums, current, self.loss),
            **{f"tinker_{k}": float(v) for k, v in (optimised.metrics or {}).items()},
        }

    async def _client_at(self, policy: str, parent: str | None) -> TrainingClient:
        if policy in self.clients and self.clients[policy][1] == parent:
            return self.clients[policy][0]
        service = await self._service_client()
        # Making a training client may open the SDK's session, which blocks until answered: off the event
        # loop.
        if parent is None:
            config = self.config
            return await asyncio.to_thread(
                lambda: service.create_lora_training_client(config.base_model, rank=config.lora_rank).result()
            )
        record = await parent_record(self.ledger, policy, parent)
        directory = await asyncio.to_thread(
            fetch_checkpoint, self.store, record, self.scratch / policy / f"fetched-{parent}"
        )
        state = tinker_paths(directory)["state"]
        return await asyncio.to_thread(
            lambda: service.create_training_client_from_state_with_optimizer(state).result()
        )


def diagnostics(datums: list[TinkerDatum], current: list[list[float]], loss: LossConfig) -> dict[str, float]:
    """Ratio, clipping, effective sample size and KL of the policy Tinker trained (its logprobs before the
    update) against each token's sampler: the same numbers the local provider reports."""
    import torch

    length = max(len(d.target_tokens_T) for d in datums)

    def padded(rows: list[list[float]] | list[tuple[float, ...]] | list[tuple[int, ...]]) -> torch.Tensor:
        return torch.tensor([list(r) + [0.0] * (length - len(r)) for r in rows], dtype=torch.float32)

    _, metrics = policy_loss(
        padded(current),
        padded([d.logprobs_T for d in datums]),
        padded([d.advantages_T for d in datums]),
        padded([d.mask_T for d in datums]),
        loss,
    )
    return {
        "ratio_mean": metrics.ratio_mean,
        "ratio_max": metrics.ratio_max,
        "clipped_fraction": metrics.clipped_fraction,
        "effective_sample_size": metrics.effective_sample_size,
        "weight_ess": metrics.weight_ess,
        "kl_k1": metrics.kl_k1,
        "kl_k3": metrics.kl_k3,
    }


def to_tinker_datum(datum: TinkerDatum) -> Any:
    import tinker

    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(list(datum.model_input_T)),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData(
                data=list(datum.target_tokens_T), dtype="int64", shape=[len(datum.target_tokens_T)]
            ),
            "logprobs": tinker.TensorData(
                data=list(datum.logprobs_T), dtype="float32", shape=[len(datum.logprobs_T)]
            ),
            "advantages": tinker.TensorData(
                data=list(datum.advantages_T), dtype="float32", shape=[len(datum.advantages_T)]
            ),
        },
    )
