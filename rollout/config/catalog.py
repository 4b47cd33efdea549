"""Models that presets name and `rollout models pull NAME` fetches: where each comes from, and its shape.

Contract:
- `CATALOG[name]` is a `CatalogModel`: the Hugging Face repository (and revision) its files come from, roughly
  how much it downloads, and its `ModelShape` for memory budgets (rollout.config.budget).
- A catalog model lives in `{models_dir}/{name}` once pulled; `pulled(name, models_dir)` says whether it is
  there (a marker written after the whole download: an interrupted pull is resumed, never taken for a model).
  Nothing downloads it at run time: engines and trainers that name it refuse to start until it is pulled.
- The built-in models (smollm2, tiny-qwen3) are not here: they are made offline from installed packages.
- `settings_budget(settings)` is the one-GPU memory budget of a configuration (its model, engine, trainer and
  gpu.* keys), or a `BudgetUnknown` saying why there is none (no gpu.memory_gib, a model not in the catalog).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollout.config import EngineKind, Settings
from rollout.config.budget import Budget, ModelShape, one_gpu_budget, vllm_default_max_num_seqs


@dataclass(frozen=True)
class CatalogModel:
    name: str
    repo: str
    revision: str
    download_gib: float
    shape: ModelShape
    about: str


# Qwen3.5-9B: 32 blocks, 3 of each 4 Gated DeltaNet (linear attention, 32 value heads of 128 × 128 state) and
# 1 gated full attention (16 query heads, 4 KV heads of 256); hidden 4096, MLP 12288, vocabulary 248320
# (untied embeddings); a 0.45B vision tower that neither the engine (--language-model-only) nor the trainer
# loads.
QWEN3_5_9B = ModelShape(
    name="Qwen3.5-9B",
    layers=32,
    hidden=4096,
    intermediate=12288,
    vocab=248320,
    linear_params=6.91e9,
    extra_params=0.45e9,
    tied_embeddings=False,
    attention_layers=8,
    kv_heads=4,
    head_dim=256,
    recurrent_state_bytes=24 * 32 * 128 * 128 * 4,
    # The adapter's targets (rollout.config.defaults.LORA_TARGET_MODULES: q, k, v, o) exist in the 8
    # full-attention blocks only (q with its output gate: 4096 -> 2 × 16 × 256): the mean over the 32 blocks.
    lora_in_out=8 * ((4096 + 8192) + (4096 + 1024) * 2 + (4096 + 4096)) // 32,
)

CATALOG: dict[str, CatalogModel] = {
    "qwen3.5-9b": CatalogModel(
        name="qwen3.5-9b",
        repo="Qwen/Qwen3.5-9B",
        revision="main",
        download_gib=17.5,
        shape=QWEN3_5_9B,
        about="Qwen3.5-9B (bf16); the minecraft-one-gpu preset serves and trains it in 4 bits (bitsandbytes nf4)",
    ),
    "qwen3-0.6b": CatalogModel(
        name="qwen3-0.6b",
        repo="Qwen/Qwen3-0.6B",
        revision="main",
        download_gib=1.5,
        shape=ModelShape(
            name="Qwen3-0.6B",
            layers=28,
            hidden=1024,
            intermediate=3072,
            vocab=151936,
            linear_params=0.44e9,
            tied_embeddings=True,
            kv_heads=8,
            head_dim=128,
            lora_in_out=(1024 + 2048) + (1024 + 1024) * 2 + (2048 + 1024),  # q, k, v, o
        ),
        about="Qwen3-0.6B (bf16): the GPU checks' model (`pytest -m gpu`, `python -m benchmarks gpu`)",
    ),
}


def model_dir(name: str, models_dir: Path) -> Path:
    return models_dir / name


PULLED_MARKER = ".rollout-pulled"  # written last: a folder without it is a download that did not finish


def pulled(name: str, models_dir: Path) -> bool:
    return (model_dir(name, models_dir) / PULLED_MARKER).is_file()


class BudgetUnknown(ValueError):
    """A configuration without the facts a budget needs; the message says which."""


def settings_budget(settings: Settings) -> Budget:
    """The memory budget of `settings` on its one GPU (see the module contract)."""
    model = CATALOG.get(settings.trainer.model)
    if model is None:
        raise BudgetUnknown(
            f"no memory budget for trainer.model={settings.trainer.model}: budgets know the catalog's models "
            f"({', '.join(CATALOG)})"
        )
    if settings.gpu.memory_gib is None:
        raise BudgetUnknown("no memory budget without the device's memory: set gpu.memory_gib (e.g. 16)")
    engine = settings.services.engine
    four_bit = settings.trainer.quantization == "nf4"
    return one_gpu_budget(
        model.shape,
        device_gib=settings.gpu.memory_gib,
        weight_format="nf4" if four_bit else "bf16",
        lora_rank=settings.trainer.lora_rank,
        engine_lora_rank=engine.vllm_max_lora_rank if settings.engine_kind == EngineKind.vllm else None,
        max_loras=engine.vllm_max_loras,
        sequences=settings.gpu.sequences,
        context_tokens=engine.vllm_max_model_len or settings.services.gateway.max_context,
        micro_batch_tokens=settings.trainer.micro_batch_tokens,
        sampled_tokens=settings.gpu.sampled_tokens,
        engine_share=engine.vllm_gpu_memory_utilization if settings.engine_kind == EngineKind.vllm else None,
        engine_sequences=engine.vllm_max_num_seqs or vllm_default_max_num_seqs(settings.gpu.memory_gib),
    )


class PullError(RuntimeError):
    """A catalog model could not be downloaded; the message says what to do."""


class ModelNotPulled(RuntimeError):
    """A catalog model is named but not pulled here."""


def pulled_path(name: str, models_dir: Path) -> str:
    """The local directory of a pulled catalog model; `ModelNotPulled` saying how to pull it otherwise."""
    if not pulled(name, models_dir):
        model = CATALOG[name]
        raise ModelNotPulled(
            f"{name} ({model.repo}, {model.download_gib:.1f} GiB) is not pulled into {models_dir}: run "
            f"`rollout models pull {name}` where a network exists (nothing downloads it at run time)"
        )
    return str(model_dir(name, models_dir))


def pull_model(model: CatalogModel, models_dir: Path) -> Path:
    """Download `model` into `{models_dir}/{name}` (resuming a partial download); `PullError` when it
    cannot."""
    target = model_dir(model.name, models_dir)
    if pulled(model.name, models_dir):
        return target
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(
            repo_id=model.repo,
            revision=model.revision,
            local_dir=target,
            allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken"],
        )
    except (
        Exception
    ) as error:  # the hub client raises many kinds (HTTP, connection, hub errors): all mean this
        raise PullError(
            f"could not download {model.repo}: {type(error).__name__}: {error}. Pulling needs network access to "
            "huggingface.co (or a mirror in $HF_ENDPOINT; a gated model also needs $HF_TOKEN). On a machine "
            f"without one, pull it elsewhere and copy the folder to {target}."
        ) from error
    if not (target / "config.json").is_file():
        raise PullError(
            f"{model.repo} downloaded without a config.json: is {model.revision!r} the right revision?"
        )
    (target / PULLED_MARKER).write_text(f"{model.repo}@{model.revision}\n")
    return target
