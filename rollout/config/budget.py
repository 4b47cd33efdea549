"""GPU memory budgets: whether an engine and a trainer sharing one GPU (`gpu.mode=shared`) fit its memory.

Contract:
- `ModelShape` is what the arithmetic needs of a model (parameter counts by kind, attention layout,
  vocabulary).
- `one_gpu_budget(...)` returns a `Budget` with two phases, each a list of named `Item`s in GiB:
  - serving: the engine awake (its weights, KV cache and recurrent state for the sequences in flight, its LoRA
    slots, its CUDA context and graphs) while the trainer holds only its CUDA context (between steps its
    weights wait in CPU memory, as the engine's do while it sleeps);
  - training: the engine asleep (vLLM sleep level 1 keeps its CUDA context and graphs on the device) while the
    trainer holds its quantized base (embeddings and LM head in bf16), the LoRA adapter with its gradients and
    Adam state, activations (gradient checkpointing: one hidden state per layer and token, plus one layer
    recomputed) for the longest sequence a micro-batch can hold (a segment longer than `micro_batch_tokens`
    trains alone, so max(micro-batch, context)), and float32 logits with their gradient at the sampled
    positions only (the trainer computes no others): at most `sampled_tokens` of them per sequence.
- vLLM takes a fixed share of the device (`engine_share`, its --gpu-memory-utilization) and fills what its
  weights and graphs leave with KV blocks: the serving phase counts that share whole, and the budget also
  checks that the share holds what the engine needs (`engine_fits`), its sampler's profiling peak included
  (logits, logprobs, probabilities and a sort over the vocabulary for `engine_sequences`, its --max-num-seqs,
  by default `vllm_default_max_num_seqs`, vLLM 0.33's own),
  and its LoRA slots at `engine_lora_rank` (its --max-lora-rank; the trainer's rank by default). Neither the
  engine (--language-model-only) nor the trainer holds a vision tower.
- `Budget.fits` holds when both phases stay under the device's memory less `headroom_gib` (allocator
  fragmentation) and the engine fits its share; `Budget.table()` is what `rollout config budget` prints. The
  numbers are estimates from the model's shape, conservative on purpose: a preset whose budget fits should not
  run out of memory for these reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.config.defaults import LORA_TARGET_MODULES

GIB = 1024**3
BYTES = {"fp32": 4.0, "bf16": 2.0, "nf4": 0.5 + 4 / 64}  # nf4: 4 bits, and a float32 scale per block of 64


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape. `linear_params` are the transformer blocks' matrices (the quantized part);
    embeddings and the LM head stay in bf16 under 4-bit quantization; `extra_params` (a vision tower, say) are
    neither served nor trained (kept for the record of the model's size)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    linear_params: float
    extra_params: float = 0.0
    tied_embeddings: bool = False
    attention_layers: int = 0  # layers with a KV cache (all of them when 0)
    kv_heads: int = 8
    head_dim: int = 128
    recurrent_state_bytes: int = 0  # per sequence, for linear-attention layers (their state, not a cache)
    # The sum of (in + out) over the modules a LoRA adapter targets
    # (rollout.config.defaults.LORA_TARGET_MODULES, which vLLM is also told), per layer: the trainer's adapter
    # and each of vLLM's LoRA slots.
    lora_in_out: int = 0

    @property
    def embedding_params(self) -> float:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def kv_bytes_per_token(self) -> float:
        layers = self.attention_layers or self.layers
        return layers * 2 * self.kv_heads * self.head_dim * BYTES["bf16"]

    def lora_params(self, rank: int) -> float:
        return self.layers * rank * self.lora_in_out


@dataclass(frozen=True)
class Item:
    name: str
    gib: float


@dataclass
class Budget:
    device_gib: float
    headroom_gib: float
    serving: list[Item] = field(default_factory=list[Item])
    training: list[Item] = field(default_factory=list[Item])
    engine_needs_gib: float = 0.0
    engine_share_gib: float | None = None  # what vLLM reserves (None: the engine takes only what it needs)

    @property
    def engine_fits(self) -> bool:
        return self.engine_share_gib is None or self.engine_needs_gib <= self.engine_share_gib

    @property
    def serving_gib(self) -> float:
        return sum(item.gib for item in self.serving)

    @property
    def training_gib(self) -> float:
        return sum(item.gib for item in self.training)

    @property
    def peak_gib(self) -> float:
        return max(self.serving_gib, self.training_gib)

    @property
    def fits(self) -> bool:
        return self.engine_fits and self.peak_gib <= self.device_gib - self.headroom_gib

    def table(self) -> str:
        lines = []
        for phase, items, total in (
            ("serving (engine awake)", self.serving, self.serving_gib),
            ("training (engine asleep)", self.training, self.training_gib),
        ):
            lines.append(f"{phase}: {total:.2f} GiB")
            width = max(len(item.name) for item in (*self.serving, *self.training))
            lines.extend(f"  {item.name:<{width}} {item.gib:6.2f}" for item in items)
        verdict = "fits" if self.fits else "does NOT fit"
        if self.engine_share_gib is not None:
            lines.append(
                f"engine needs {self.engine_needs_gib:.2f} GiB of the {self.engine_share_gib:.2f} GiB vLLM reserves"
                + ("" if self.engine_fits else ": raise services.engine.vllm_gpu_memory_utilization")
            )
        lines.append(
            f"peak {self.peak_gib:.2f} GiB of {self.device_gib:.0f} GiB "
            f"(less {self.headroom_gib:.1f} headroom): {verdict}"
        )
        return "\n".join(lines)


def one_gpu_budget(
    model: ModelShape,
    *,
    device_gib: float,
    weight_format: str,
    lora_rank: int,
    max_loras: int,
    sequences: int,
    context_tokens: int,
    micro_batch_tokens: int,
    sampled_tokens: int | None = None,
    engine_share: float | None = None,
    engine_sequences: int,
    engine_lora_rank: int | None = None,
    headroom_gib: float = 0.75,
    cuda_context_gib: float = 0.5,
    cuda_graphs_gib: float = 0.5,
) -> Budget:
    """The serving and training phases of `model` on one device (see the module contract)."""
    quantized = model.linear_params * BYTES[weight_format]
    # Neither loads a vision tower: vLLM serves the language model only (--language-model-only), and the
    # trainer has none to train.
    weights = (quantized + model.embedding_params * BYTES["bf16"]) / GIB
    trainer_weights = weights
    adapter = model.lora_params(lora_rank)
    slot_rank = engine_lora_rank or lora_rank  # vLLM sizes every slot at its --max-lora-rank
    kv = sequences * context_tokens * model.kv_bytes_per_token() / GIB
    state = sequences * model.recurrent_state_bytes / GIB
    sequence = max(micro_batch_tokens, context_tokens)
    scored = min(sequence, sampled_tokens or sequence)
    checkpointed = sequence * model.layers * model.hidden * BYTES["bf16"] / GIB
    one_layer = sequence * (4 * model.hidden + 3 * model.intermediate) * BYTES["bf16"] * 2 / GIB
    logits = scored * model.vocab * BYTES["fp32"] * 2 / GIB  # the logits and their gradient
    serving = [
        Item(f"engine weights ({weight_format} blocks, bf16 embeddings)", weights),
        Item(f"engine KV cache ({sequences} × {context_tokens} tokens)", kv),
        Item("engine recurrent state (linear attention)", state),
        Item(
            f"engine LoRA slots ({max_loras} × rank {slot_rank} on {'/'.join(LORA_TARGET_MODULES)}, bf16)",
            max_loras * model.lora_params(slot_rank) * 2 / GIB,
        ),
        Item("engine CUDA graphs", cuda_graphs_gib),
    ]
    if engine_share is not None:
        # vLLM's start-up profiling samples `engine_sequences` sequences at once (its --max-num-seqs), per
        # vocabulary entry: the bf16 logits, their fp32 copy, the raw logprobs (--logprobs-mode raw_logprobs),
        # the probabilities, and the top-p sort's values with their int64 indices. What that peak takes is
        # taken from the KV cache it then sizes, so it counts against the share.
        per_entry = BYTES["bf16"] + 4 * BYTES["fp32"] + 8
        sampler = engine_sequences * model.vocab * per_entry / GIB
        serving.append(Item(f"engine sampler's profiling peak ({engine_sequences} sequences)", sampler))
    needs = sum(item.gib for item in serving)
    share = None if engine_share is None else engine_share * device_gib
    if share is not None and share > needs:
        serving.append(Item("more KV blocks, filling vLLM's share", share - needs))
    serving += [
        Item("engine CUDA context", cuda_context_gib),
        Item("trainer CUDA context (weights in CPU memory)", cuda_context_gib),
    ]
    training = [
        Item("engine asleep (CUDA context and graphs)", cuda_context_gib + cuda_graphs_gib),
        Item(f"trainer weights ({weight_format} blocks, bf16 embeddings)", trainer_weights),
        Item(f"LoRA rank {lora_rank}: weights, gradients, Adam (fp32)", adapter * 4 * 4 / GIB),
        Item(f"activations ({sequence} tokens, checkpointed)", checkpointed + one_layer),
        Item(f"logits and their gradient (fp32, {scored} positions)", logits),
        Item("trainer CUDA context", cuda_context_gib),
    ]
    return Budget(
        device_gib=device_gib,
        headroom_gib=headroom_gib,
        serving=serving,
        training=training,
        engine_needs_gib=needs,
        engine_share_gib=share,
    )


def vllm_default_max_num_seqs(device_gib: float) -> int:
    """vLLM 0.33's default --max-num-seqs for `vllm serve`: 1024 on a GPU of 70 GiB or more (an H100, H200),
    256 below (it keeps 256 on an A100 of 80 GiB too, which this errs above)."""
    return 1024 if device_gib >= 70 else 256
