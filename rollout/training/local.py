"""The local training provider: transformers + peft on CPU (fp32) or CUDA (bf16), one train step at a time.

Contract:
- `LocalTrainer.step(batch)` runs forward/backward over the batch's segments in micro-batches of at most
  `micro_batch_tokens` tokens, with the loss of rollout.rl.losses normalised over the whole batch's
  sampled tokens (so micro-batching does not change the gradient), clips the gradient norm, and takes an
  AdamW step; `updates_per_batch` times over the same batch (PPO's epochs), against π_old, the policy before
  the first (its logprobs kept from the first pass: from the second update on, PPO's clip acts). It returns
  the step's metrics over all its updates: means averaged, maxima the largest. A loss that is not finite
  raises `NonFiniteLoss` before its update changes any weight: the step is not published (earlier updates of
  the step have changed this trainer in memory: its caller drops it and resumes from the parent checkpoint).
- Each segment trains as one sequence: position t predicts token t+1; the loss mask, behaviour logprobs and
  advantages are those of the predicted tokens. Within a micro-batch, a token prefix several segments share is
  computed once (a prefix tree) where the model's layers allow, else segments are packed end to end or padded;
  a model that cannot share says so once in the log. `micro_batch_tokens` counts the tokens computed. The LM
  head runs only where a sampled token is predicted (rollout.training.logprobs). Each step reports
  `computed_tokens` (what its forward passes computed, per update) and `segment_tokens` (what its segments
  hold): their ratio is what sharing saved; `entropy`, π_θ's mean next-token entropy (nats) over the
  sampled tokens at each update's start (averaged over the updates like the other means); `train_s`, the
  step's wall time in the trainer; `model_tflops_per_s`, the model FLOPs its updates computed per second
  (rollout.training.flops), and on a GPU whose peak is known `peak_tflops` and `mfu`, their share of it.
  A data-parallel shard reports its own means over the tokens it trained.
- LoRA (rank, alpha, target modules) or full weights. `save(directory)` writes the weights (a peft adapter
  directory, which the local engine and vLLM load as is, or the full model) with the optimiser state and the
  step count; `LocalTrainer.resume(directory, ...)` continues from any checkpoint exactly.
- `quantization="nf4"` (QLoRA, CUDA only) loads the frozen base in 4 bits through bitsandbytes, with gradient
  checkpointing; asked for where it cannot run (CPU, full weights), the constructor raises `ValueError` saying
  so.
- Data parallel: `step(batch, shard=(rank, world))` in each of `world` processes (torch.distributed
  initialised, e.g. by Ray Train) trains on the rank-th of `world` shards and sums the gradients: the update
  equals `step(batch)` in one process. Shards are runs of the segments sorted by their ids, of about equal
  tokens, so segments that share a prefix (a group's answers) mostly share a shard and its prefix tree. A
  non-finite loss on any process fails the step on all of them.
- `offload()` moves the weights and optimiser state to CPU memory and frees the device; `onload()` brings them
  back (one-GPU mode, between steps). On CPU both do nothing.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rollout.config import defaults
from rollout.rl.batches import Batch
from rollout.rl.losses import LossConfig, LossMetrics, NonFiniteLoss, policy_loss
from rollout.training.flops import peak_tflops, training_flops_per_token
from rollout.training.logprobs import Rows, layout_for, micro_batches, sampled_logprobs

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer.json"
OPTIMIZER_STATE = "optimizer.pt"


@dataclass(frozen=True)
class LocalTrainerConfig:
    lora_rank: int | None = 8  # None: train the full weights
    lora_alpha: int = 16
    target_modules: tuple[str, ...] = defaults.LORA_TARGET_MODULES
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 4096
    device: str | None = None  # default: cuda when there is one
    seed: int = 0
    quantization: str | None = None  # nf4: QLoRA (the frozen base in 4 bits through bitsandbytes; CUDA only)
    updates_per_batch: int = 1  # AdamW steps over each batch (PPO's epochs); the step count counts batches

    def __post_init__(self) -> None:
        if self.updates_per_batch < 1:
            raise ValueError("updates_per_batch is how many optimiser steps each batch takes: 1 or more")


def _quantized(config: LocalTrainerConfig, device: str) -> dict[str, Any]:
    """`from_pretrained` arguments for a quantized base (QLoRA), refused where it cannot run."""
    if config.quantization is None:
        return {}
    if config.quantization != "nf4":
        raise ValueError(f"trainer.quantization must be nf4 (or null), not {config.quantization!r}")
    if config.lora_rank is None:
        raise ValueError(
            "trainer.quantization=nf4 trains LoRA adapters on a frozen 4-bit base: set trainer.lora_rank"
        )
    if not device.startswith("cuda"):
        raise ValueError("trainer.quantization=nf4 needs a CUDA GPU (bitsandbytes' 4-bit kernels)")
    from transformers import BitsAndBytesConfig

    return {
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=False,
        ),
        "device_map": {"": device},
    }


class LocalTrainer:
    def __init__(
        self, model_path: str, config: LocalTrainerConfig, loss: LossConfig, *, adapter: str | None = None
    ) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(config.seed)
        self.config, self.loss = config, loss
        self.model_path = model_path
        self.device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        model: Any = AutoModelForCausalLM.from_pretrained(
            adapter if adapter and config.lora_rank is None else model_path,
            dtype=dtype,
            **_quantized(config, self.device),
        )
        if config.quantization is not None:
            # Not peft's prepare_model_for_kbit_training: it casts every weight left unquantized (embeddings,
            # LM head) to float32, twice their memory. Gradients reach the adapters through checkpointed
            # blocks.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        if config.lora_rank is not None:
            from peft import LoraConfig, PeftModel, get_peft_model

            if adapter is not None:
                model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
            else:
                lora = LoraConfig(
                    r=config.lora_rank,
                    lora_alpha=config.lora_alpha,
                    target_modules=list(config.target_modules),
                    task_type="CAUSAL_LM",
                )
                model = get_peft_model(model, lora)
        # A quantized model is placed on the device as it loads (bitsandbytes packs its weights there).
        self.model: Any = (model if config.quantization else model.to(self.device)).train()
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.flops_per_token = training_flops_per_token(*_parameter_counts(self.model))
        self.peak_tflops = (
            peak_tflops(torch.cuda.get_device_name(self.device)) if self.device.startswith("cuda") else None
        )
        self.optimizer = torch.optim.AdamW(
            self.parameters, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.steps = 0
        self.layout, unshared = layout_for(self.model.config)
        if unshared is not None:
            log.warning("training without shared prefixes: %s", unshared)

    def step(self, batch: Batch, *, shard: tuple[int, int] | None = None) -> dict[str, float]:
        """One AdamW step over `batch`. With `shard=(rank, world)` (data parallel, torch.distributed
        initialised), this process takes segments rank, rank + world, ... and the gradients are summed across
        processes before clipping: every process makes the update one process would make on the whole
        batch."""
        if not batch.segments or batch.sampled_tokens == 0:
            raise ValueError("a batch with no sampled tokens has nothing to train on")
        segments = batch.segments if shard is None else _shard(batch.segments, *shard)
        olds: list[torch.Tensor] = []  # π_old's logprobs per micro-batch, from the first update's pass
        updates: list[dict[str, float]] = []
        started = time.monotonic()
        for update in range(self.config.updates_per_batch):
            updates.append(self._update(batch, segments, olds, shard=shard, first=update == 0))
        self.steps += 1
        train_s = time.monotonic() - started
        metrics = {"step": float(self.steps), **_over_updates(updates), "train_s": train_s}
        # Every update's forward and backward passes: computed_tokens is per update.
        tflops = self.flops_per_token * metrics["computed_tokens"] * len(updates) / train_s / 1e12
        metrics["model_tflops_per_s"] = tflops
        if self.peak_tflops is not None:
            metrics["mfu"] = tflops / self.peak_tflops
            metrics["peak_tflops"] = self.peak_tflops
        return metrics

    def _update(
        self,
        batch: Batch,
        segments: tuple[Any, ...],
        olds: list[torch.Tensor],
        *,
        shard: tuple[int, int] | None,
        first: bool,
    ) -> dict[str, float]:
        """One AdamW step over the segments; the first update records π_old's logprobs into `olds`."""
        self.optimizer.zero_grad(set_to_none=True)
        parts: list[tuple[float, LossMetrics, float]] = []
        total, finite = 0.0, True
        computed = 0
        micros = micro_batches(segments, self.config.micro_batch_tokens, layout=self.layout)
        for index, micro in enumerate(micros):
            rows = Rows.build(micro, layout=self.layout).to(self.device)
            computed += rows.computed_tokens
            scores = sampled_logprobs(self.model, rows)
            logprobs_N = scores.logprobs_N
            if first:
                olds.append(logprobs_N.detach())
            # One flat row of the sampled tokens: the loss is token-level, so [1, N] is the batch's sum.
            loss, metrics = policy_loss(
                logprobs_N[None],
                rows.behaviour_N[None],
                rows.advantage_N[None],
                torch.ones_like(rows.behaviour_N)[None],
                self.loss,
                old_logprobs_BT=olds[index][None],
            )
            share = metrics.tokens / batch.sampled_tokens  # of the whole batch: shards sum to the whole
            scaled = loss * share
            if not math.isfinite(scaled.item()):
                finite = False
                break
            scaled.backward()
            total += scaled.item()
            parts.append((share, metrics, float(scores.entropy_N.mean()) if share else 0.0))
        if shard is not None:  # every process learns whether any failed, then they sum what they computed
            finite, total = _all_reduce_step(self.parameters, finite, total)
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLoss(f"step {self.steps + 1}: the loss is not finite; no weights were changed")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLoss(
                f"step {self.steps + 1}: the gradient norm is {grad_norm}; no weights were changed"
            )
        self.optimizer.step()
        return {
            "loss": total,
            "grad_norm": grad_norm,
            "tokens": float(batch.sampled_tokens),
            "computed_tokens": float(computed),
            "segment_tokens": float(sum(len(w.segment.tokens_T) for w in segments)),
            **_combine(parts),
        }

    def offload(self) -> None:
        """Move the weights and optimiser state to CPU memory and free the device (one-GPU mode, between
        steps)."""
        self._place("cpu")
        if self.device.startswith("cuda"):
            torch._C._cuda_clearCublasWorkspaces()  # the step's cuBLAS workspace too (32 MiB on Hopper)
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Bring them back to the device before a step."""
        self._place(self.device)

    def _place(self, device: str) -> None:
        if not self.device.startswith("cuda"):
            return  # on CPU there is nothing to free
        self.model.to(device)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":  # AdamW keeps its step count on CPU
                    state[key] = value.to(device)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_STATE)
        (directory / TRAINER_STATE).write_text(
            json.dumps({"steps": self.steps, "model_path": self.model_path, "config": asdict(self.config)})
        )

    @classmethod
    def resume(cls, directory: Path, config: LocalTrainerConfig, loss: LossConfig) -> LocalTrainer:
        state = json.loads((directory / TRAINER_STATE).read_text())
        trainer = cls(state["model_path"], config, loss, adapter=str(directory))
        if (directory / OPTIMIZER_STATE).exists():  # a warm start (SFT) has none: the optimiser starts fresh
            trainer.optimizer.load_state_dict(torch.load(directory / OPTIMIZER_STATE, weights_only=True))
        trainer.steps = int(state["steps"])
        return trainer


class Trainer(Protocol):
    """What the trainer worker's activities need of a trainer: `LocalTrainer`, or a data-parallel group of
    them."""

    steps: int

    def step(self, batch: Batch) -> dict[str, float]: ...
    def save(self, directory: Path) -> None: ...
    def offload(self) -> None: ...
    def onload(self) -> None: ...


class TrainerBuilder(Protocol):
    def build(self, model_path: str, config: LocalTrainerConfig, loss: LossConfig) -> Trainer: ...
    def resume(self, directory: Path, config: LocalTrainerConfig, loss: LossConfig) -> Trainer: ...


class OneProcess:
    """Builds `LocalTrainer`s in this process (rollout.training.data_parallel builds groups of them on
    Ray)."""

    def build(self, model_path: str, config: LocalTrainerConfig, loss: LossConfig) -> Trainer:
        return LocalTrainer(model_path, config, loss)

    def resume(self, directory: Path, config: LocalTrainerConfig, loss: LossConfig) -> Trainer:
        return LocalTrainer.resume(directory, config, loss)


def _shard(segments: tuple[Any, ...], rank: int, world: int) -> tuple[Any, ...]:
    """The rank-th of `world` runs of the segments sorted by their ids, cut at about equal token counts (each
    shard gets one segment at least, where there are as many)."""
    ordered = sorted(segments, key=lambda weighted: weighted.segment.tokens_T)
    starts, total, before = [], sum(len(w.segment.tokens_T) for w in ordered), 0
    for weighted in ordered:
        starts.append(before)  # tokens before this segment
        before += len(weighted.segment.tokens_T)
    cuts = [0]
    for r in range(1, world):
        cut = next((i for i, b in enumerate(starts) if b * world >= r * total), len(ordered))
        # Each shard gets a segment at least while there are as many (the earlier shards first).
        latest = max(len(ordered) - (world - r), cuts[-1] + 1)
        cuts.append(min(max(cut, cuts[-1] + 1), latest, len(ordered)))
    cuts.append(len(ordered))
    return tuple(ordered[cuts[rank] : cuts[rank + 1]])


def _all_reduce_step(parameters: list[torch.nn.Parameter], finite: bool, total: float) -> tuple[bool, float]:
    """Data parallel: whether every process's loss was finite, the summed loss, and the summed gradients."""
    import torch.distributed as dist

    device = parameters[0].device
    all_finite = torch.tensor([1.0 if finite else 0.0], dtype=torch.float64, device=device)
    summed = torch.tensor([total], dtype=torch.float64, device=device)
    dist.all_reduce(all_finite, op=dist.ReduceOp.MIN)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    if all_finite.item() < 1.0:
        return False, math.nan
    for parameter in parameters:
        if parameter.grad is None:  # this shard did not reach it: it contributes zeros
            parameter.grad = torch.zeros_like(parameter)
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
    return True, float(summed.item())


def _parameter_counts(model: Any) -> tuple[int, int]:
    """(all, trainable) parameters; peft's count, where it is one, holds 4-bit weights at their real size."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        return int(total), int(trainable)
    return sum(p.numel() for p in model.parameters()), sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )


def _over_updates(updates: list[dict[str, float]]) -> dict[str, float]:
    """A step's metrics from its updates': maxima (ratio_max, grad_norm) the largest, the rest averaged."""
    if len(updates) == 1:
        return updates[0]
    combined = {key: sum(u[key] for u in updates) / len(updates) for key in updates[0]}
    for key in ("ratio_max", "grad_norm"):
        combined[key] = max(u[key] for u in updates)
    combined["updates"] = float(len(updates))
    return combined


def _combine(parts: list[tuple[float, LossMetrics, float]]) -> dict[str, float]:
    """Micro-batch diagnostics (with each one's mean entropy), weighted by their share of the sampled tokens
    this process trained (maxima stay maxima): a data-parallel shard's are its own means, not a fraction of
    the batch's."""
    keys = (
        "ratio_mean",
        "clipped_fraction",
        "masked_fraction",
        "effective_sample_size",
        "weight_ess",
        "kl_k1",
        "kl_k3",
    )
    whole = sum(share for share, _, _ in parts)
    if not whole:
        return {}  # nothing trained here (an empty data-parallel shard): no means to report
    combined: dict[str, float] = {
        key: sum(share * float(getattr(m, key)) for share, m, _ in parts) / whole for key in keys
    }
    combined["entropy"] = sum(share * entropy for share, _, entropy in parts) / whole
    combined["ratio_max"] = max(m.ratio_max for _, m, _ in parts)
    return combined
