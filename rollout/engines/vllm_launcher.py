"""The `vllm serve` command line for an engine rollout drives: LoRA hot-loading and sleep mode switched on.

Contract: `launch_for(settings, ...)` is the `VLLMLaunch` the settings (`services.engine.vllm_*`) make, and
`command(launch)` a pure function from it to argv and environment; the caller runs it. The
checkpoint's `generation_config.json` sets no sampling default (`--generation-config vllm`: a top_k, min_p or
penalty the request does not send is neutral), and logprobs are the model's raw ones (`--logprobs-mode
raw_logprobs`, the engine protocol's); a multimodal checkpoint serves its language model only
(`--language-model-only`); prefix caching is on, and answers report the prompt tokens it held
(`--enable-prefix-caching`, `--enable-prompt-tokens-details`); LoRA slots are reserved for the modules
rollout's adapters train (`--lora-target-modules`, `rollout.config.defaults.LORA_TARGET_MODULES`).
Checkpoints then arrive as LoRA adapters through `/v1/load_lora_adapter` (runtime LoRA updating is enabled by
the environment), and the follower puts the engine to sleep (`/sleep`) while a trainer holds the GPU.
The engine API key (`VLLMLaunch.api_key`, rollout.serving.keys.engine_api_key) is given in the environment, as
`VLLM_API_KEY` (vLLM's default for `--api-key`), never on the command line, where `ps` shows it to every user
of the machine. vLLM checks it on its `/v1`, `/v2`, `/inference` and `/cohere` paths only, so the launch also
loads `rollout.engines.vllm_guard.EngineKeyGuard` (`--middleware`), which checks it on every route but
`/health`: `/sleep`, `/wake_up`, `/pause`, `/collective_rpc` and the rest included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rollout.config import defaults
from rollout.engines.vllm_guard import MIDDLEWARE as GUARD_MIDDLEWARE

if TYPE_CHECKING:
    from rollout.config import Settings


@dataclass(frozen=True)
class VLLMLaunch:
    model: str
    host: str = "127.0.0.1"
    port: int = 8100
    served_name: str = "base"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.85
    lora: bool = True
    max_lora_rank: int = 64
    max_loras: int = 4
    max_num_seqs: int | None = None  # None: vLLM's default
    lora_target_modules: tuple[str, ...] = defaults.LORA_TARGET_MODULES
    sleep_mode: bool = True
    quantization: str | None = None
    dtype: str = "auto"
    extra_args: tuple[str, ...] = ()
    api_key: str = field(kw_only=True, repr=False)  # VLLM_API_KEY, in the environment only


def launch_for(
    settings: Settings, model_path: str, *, host: str, port: int, served_name: str, api_key: str
) -> VLLMLaunch:
    engine = settings.services.engine
    return VLLMLaunch(
        model_path,
        api_key=api_key,
        host=host,
        port=port,
        served_name=served_name,
        max_model_len=engine.vllm_max_model_len or settings.services.gateway.max_context,
        gpu_memory_utilization=engine.vllm_gpu_memory_utilization,
        max_lora_rank=engine.vllm_max_lora_rank,
        max_loras=engine.vllm_max_loras,
        max_num_seqs=engine.vllm_max_num_seqs,
        quantization=engine.vllm_quantization,
        extra_args=tuple(engine.vllm_extra_args),
    )


def command(launch: VLLMLaunch) -> tuple[list[str], dict[str, str]]:
    argv = [
        "vllm",
        "serve",
        launch.model,
        "--host",
        launch.host,
        "--port",
        str(launch.port),
        "--served-model-name",
        launch.served_name,
        "--gpu-memory-utilization",
        str(launch.gpu_memory_utilization),
        "--dtype",
        launch.dtype,
        # Token-id prompts in, token ids out: the gateway never lets the engine re-tokenise.
        "--return-tokens-as-token-ids",
        # No sampling defaults from the checkpoint's generation_config.json (Qwen's ship top_k 20): a setting
        # a request leaves out is then vLLM's neutral one, so nothing the turn did not ask for shapes the
        # draw.
        "--generation-config",
        "vllm",
        # The engine protocol's logprob (the model's, at temperature 1), named so no default can move it.
        "--logprobs-mode",
        "raw_logprobs",
        # rollout's turns are text: a multimodal checkpoint's vision tower is neither loaded nor profiled, and
        # no encoder cache is reserved (a text-only model ignores the flag).
        "--language-model-only",
        # Every turn re-sends its conversation: the prefix cache (vLLM's default for most models, named so no
        # default can move it) makes a turn prefill only its new tokens, and each answer says how many of its
        # prompt's tokens the cache held (usage.prompt_tokens_details.cached_tokens), which each turn records.
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]
    if not launch.api_key:
        raise ValueError("vllm serve needs the engine API key: without one, anyone who reaches it drives it")
    env: dict[str, str] = {"VLLM_API_KEY": launch.api_key}  # never in argv: `ps` shows that to everyone
    # vLLM checks the key on /v1 only; the guard checks it on every route but /health.
    argv += ["--middleware", GUARD_MIDDLEWARE]
    if launch.max_model_len:
        argv += ["--max-model-len", str(launch.max_model_len)]
    if launch.lora:
        argv += [
            "--enable-lora",
            "--max-lora-rank",
            str(launch.max_lora_rank),
            "--max-loras",
            str(launch.max_loras),
            # Slots for the modules rollout's adapters train, not for every module vLLM supports (the MLP
            # and the linear-attention projections would take memory the budget does not give them).
            "--lora-target-modules",
            *launch.lora_target_modules,
        ]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if launch.sleep_mode:
        argv.append("--enable-sleep-mode")
        env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes /sleep, /wake_up, /is_sleeping, /pause and /resume
    if launch.max_num_seqs:
        argv += ["--max-num-seqs", str(launch.max_num_seqs)]
    if launch.quantization:
        argv += ["--quantization", launch.quantization]
    return [*argv, *launch.extra_args], env
