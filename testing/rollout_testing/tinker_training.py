"""The training side of the FAKE Tinker service: LoRA training clients answered by torch + peft on a local
model.

Tinker's API cannot be reached from CI; rollout's Tinker training provider is tested against this fake, which
speaks what the real `tinker` SDK sends (`forward_backward` as the `ForwardBackwardRequest` protobuf the SDK
ships; `create_model`, `optim_step`, `save_weights`, `save_weights_for_sampler`, `load_weights`, `get_info` as
JSON) and answers with the shapes the SDK parses. It is not Tinker: one process, one small model, no queue.

Contract:
- `create_model` makes a LoRA model (the rank asked for) on the fake's local weights of its one base model,
  under the id the SDK derives too (`{session}:train:{n}`); `load_weights` without a model makes one from the
  saved state (`create_training_client_from_state…`).
- `forward_backward` computes, per datum, the logprob of each `target_tokens` entry given `model_input`, and
  the loss of the named function, summed over tokens and datums, exactly as Tinker documents them:
  `cross_entropy` −Σ w·logp; `importance_sampling` −Σ exp(logp − q)·A; `ppo` −Σ min(r·A, clip(r, lo, hi)·A)
  with r = exp(logp − q) and lo/hi from `clip_low_threshold`/`clip_high_threshold` (0.8/1.2); `cispo` −Σ
  sg(clip(r, lo, hi))·A·logp. Gradients accumulate until `optim_step` (AdamW with the request's parameters,
  gradient clipping when `grad_clip_norm` > 0), which clears them.
- The output (the `ForwardBackwardOutput` protobuf, the only form this SDK reads) carries each datum's
  `logprobs` (before the update) and `loss:sum`; a non-finite loss is answered
  as an error of category `user`, with nothing accumulated.
- `save_weights` saves adapter and optimiser (`tinker://{model}/weights/{name}`); `load_weights` restores them
  into a model (with or without the optimiser); `save_weights_for_sampler` saves the adapter and makes its
  sampler path (`tinker://{model}/sampler_weights/{name}`) servable by the fake's sampling side.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
OPTIMIZER_FILE = "optimizer.pt"


class FakeTinkerUserError(ValueError):
    """The request cannot be trained on (Tinker answers these as errors of category `user`)."""


@dataclass
class _Model:
    model_id: str
    rank: int
    model: Any
    optimizer: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: int = 0


@dataclass
class FakeTinkerTraining:
    """The fake's trainer: `weights` is the local path of the base model it trains on (a tiny one in
    tests)."""

    weights: str
    storage: Path
    models: dict[str, _Model] = field(default_factory=dict[str, _Model])
    losses_seen: list[str] = field(default_factory=list[str])
    _build_lock: threading.Lock = field(default_factory=threading.Lock)

    def create_model(self, model_id: str, rank: int, seed: int | None = None) -> str:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        with self._build_lock:  # transformers cannot build two models at once in one process
            torch.manual_seed(seed or 0)
            base = AutoModelForCausalLM.from_pretrained(self.weights, dtype=torch.float32)
            lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
            model = get_peft_model(base, lora).train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.models[model_id] = _Model(
            model_id=model_id, rank=rank, model=model, optimizer=torch.optim.AdamW(trainable, lr=1e-4)
        )
        return model_id

    def model(self, model_id: str) -> _Model:
        if model_id not in self.models:
            raise FakeTinkerUserError(f"no model {model_id!r}")
        return self.models[model_id]

    def forward_backward(self, model_id: str, request: Any, *, forward_only: bool) -> bytes:
        """`request`: the parsed `ForwardBackwardRequest` protobuf."""
        import torch

        held = self.model(model_id)
        loss_fn = request.loss_fn
        if loss_fn not in LOSSES:
            raise FakeTinkerUserError(
                f"the fake Tinker service has no loss {loss_fn!r} (it has {', '.join(LOSSES)})"
            )
        config = {k: v.number for k, v in request.loss_fn_config_v2.items()} or dict(request.loss_fn_config)
        low, high = (
            float(config.get("clip_low_threshold", 0.8)),
            float(config.get("clip_high_threshold", 1.2)),
        )
        self.losses_seen.append(loss_fn)
        with held.lock:
            outputs: list[list[float]] = []
            losses = []
            for datum in request.data:
                tokens = [t for chunk in datum.model_input for t in _chunk_tokens(chunk)]
                inputs = {name: _tensor(tensor) for name, tensor in datum.loss_fn_inputs.items()}
                targets = torch.as_tensor(inputs["target_tokens"], dtype=torch.long)
                if len(targets) != len(tokens):
                    raise FakeTinkerUserError(
                        f"target_tokens has {len(targets)} entries for {len(tokens)} input tokens"
                    )
                logits = held.model(input_ids=torch.as_tensor([tokens])).logits[0].float()
                logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
                losses.append(_loss(loss_fn, logp, inputs, low, high))
                outputs.append(logp.detach().tolist())
            total = torch.stack(losses).sum()
            if not math.isfinite(float(total.detach())):
                raise FakeTinkerUserError(f"the loss is {float(total)}")
            if not forward_only:
                total.backward()
        return _forward_backward_output(outputs, float(total.detach()))

    def optim_step(self, model_id: str, params: dict[str, Any]) -> dict[str, Any]:
        import torch

        held = self.model(model_id)
        with held.lock:
            trainable = [p for p in held.model.parameters() if p.requires_grad]
            clip = float(params.get("grad_clip_norm") or 0.0)
            norm = float(torch.nn.utils.clip_grad_norm_(trainable, clip if clip > 0 else float("inf")))
            for group in held.optimizer.param_groups:
                group["lr"] = float(params.get("learning_rate", 1e-4))
                group["betas"] = (float(params.get("beta1", 0.9)), float(params.get("beta2", 0.95)))
                group["eps"] = float(params.get("eps", 1e-12))
                group["weight_decay"] = float(params.get("weight_decay", 0.0))
            held.optimizer.step()
            held.optimizer.zero_grad(set_to_none=True)
            held.steps += 1
        return {"metrics": {"grad_norm": norm}}

    def save(self, model_id: str, name: str, *, for_sampler: bool) -> tuple[str, Path]:
        """Save the adapter (and, for a state, the optimiser); the tinker path and the folder it is in."""
        import torch

        held = self.model(model_id)
        kind = "sampler_weights" if for_sampler else "weights"
        folder = self.storage / model_id / kind / name
        with held.lock:
            held.model.save_pretrained(folder)
            if not for_sampler:
                torch.save(held.optimizer.state_dict(), folder / OPTIMIZER_FILE)
        return f"tinker://{model_id}/{kind}/{name}", folder

    def saved_rank(self, path: str) -> int:
        return int(json.loads((self.folder(path) / "adapter_config.json").read_text())["r"])

    def load(self, model_id: str, path: str, *, optimizer: bool) -> None:
        import torch
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = self.folder(path)
        held = self.model(model_id)
        with held.lock:
            set_peft_model_state_dict(held.model, load_file(str(folder / "adapter_model.safetensors")))
            if optimizer:
                held.optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE, weights_only=True))

    def folder(self, path: str) -> Path:
        if not path.startswith("tinker://"):
            raise FakeTinkerUserError(f"{path!r} is not a tinker:// path")
        folder = self.storage / path.removeprefix("tinker://")
        if not (folder / "adapter_model.safetensors").exists():
            raise FakeTinkerUserError(f"no weights at {path}")
        return folder


def _forward_backward_output(logprobs: list[list[float]], loss: float) -> bytes:
    """The `ForwardBackwardOutput` protobuf the SDK reads: one ArrayRecord, each datum's logprobs batched."""
    from tinker.proto import tinker_public_pb2 as public_pb

    flat = np.asarray([lp for row in logprobs for lp in row], dtype=np.float32)
    offsets = np.cumsum([0] + [4 * len(row) for row in logprobs], dtype=np.int64)
    batched = public_pb.BatchedTensor(
        data=flat.tobytes(), offsets=offsets.tobytes(), dtype=public_pb.DTYPE_FLOAT32
    )
    record = public_pb.ArrayRecord(fields={"logprobs": batched}, num_datums=len(logprobs))
    output = public_pb.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record], metrics={"loss:sum": loss}
    )
    return output.SerializeToString()


def _chunk_tokens(chunk: Any) -> list[int]:
    if not chunk.HasField("encoded_text"):
        raise FakeTinkerUserError("the fake Tinker service trains on token chunks only")
    return np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()


def _tensor(tensor: Any) -> list[float]:
    from tinker.proto import tinker_public_pb2 as public_pb

    if tensor.HasField("sparse_csr"):
        csr = tensor.sparse_csr
        values_type = np.int64 if tensor.dtype == public_pb.DTYPE_INT64 else np.float32
        dense = np.zeros(int(np.prod(list(tensor.shape))), dtype=values_type)
        columns = np.frombuffer(csr.col_indices, dtype=np.int64)
        dense[columns] = np.frombuffer(csr.values, dtype=values_type)
        return dense.tolist()
    dtype = np.int64 if tensor.dtype == public_pb.DTYPE_INT64 else np.float32
    return np.frombuffer(tensor.dense, dtype=dtype).tolist()


def _loss(loss_fn: str, logp: Any, inputs: dict[str, list[float]], low: float, high: float) -> Any:
    import torch

    def given(name: str) -> Any:
        if name not in inputs:
            raise FakeTinkerUserError(f"loss {loss_fn!r} needs loss_fn_inputs[{name!r}]")
        return torch.as_tensor(inputs[name], dtype=torch.float32)

    if loss_fn == "cross_entropy":
        return -(given("weights") * logp).sum()
    advantages, sampling = given("advantages"), given("logprobs")
    ratio = torch.exp(logp - sampling)
    if loss_fn == "importance_sampling":
        return -(ratio * advantages).sum()
    if loss_fn == "ppo":
        return -torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages).sum()
    return -(torch.clamp(ratio, low, high).detach() * advantages * logp).sum()  # cispo
