"""The engine the embedded stack starts for its gateway: `rollout engine serve` of the kind the settings
choose.

Contract:
- `engine_arguments(settings)` are the `rollout engine serve` arguments for `settings.engine_kind` (local,
  vllm or tinker) serving services.gateway.model at services.gateway.engine_host:engine_port, its follower
  giving way to the GPU lease in one-GPU mode (`gpu.mode=shared`). The engine process reads services.engine.*
  itself.
- `engine_problem(settings)` says, in one line, why that engine cannot run here (vllm without the `vllm`
  extra, a bitsandbytes base without `vllm-bnb-plugin` in the Python that runs `vllm`, vllm without a CUDA
  GPU, tinker without TINKER_API_KEY) and what to do instead; None when it can. The stack checks it
  (`check_engine`, raising `EngineNotRunnableError`) before it starts anything.
- `engine_overrides(settings)` carry services.engine.* (and the context length) to the engine process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import cast

from rollout.config import EngineKind, Settings


def engine_arguments(settings: Settings) -> tuple[str, ...]:
    gateway, engine = settings.services.gateway, settings.services.engine
    kind = settings.engine_kind
    arguments = [
        "engine",
        "serve",
        "--kind",
        kind.value,
        "--model",
        gateway.model,
        "--host",
        gateway.engine_host,
        "--port",
        str(gateway.engine_port),
    ]
    if kind == EngineKind.local and engine.device:
        arguments += ["--device", engine.device]
    if kind == EngineKind.tinker:
        if settings.trainer.tinker_base_model:
            arguments += ["--tinker-base-model", settings.trainer.tinker_base_model]
        if settings.trainer.tinker_url:
            arguments += ["--tinker-url", settings.trainer.tinker_url]
    if settings.gpu_lease:
        arguments += ["--gpu", settings.gpu_lease]
    return tuple(arguments)


def has_cuda_gpu() -> bool:
    """An NVIDIA GPU with its driver loaded (without importing torch, which takes seconds)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def engine_problem(settings: Settings) -> str | None:
    kind = settings.engine_kind
    if kind == EngineKind.vllm:
        vllm = shutil.which("vllm")
        if vllm is None:
            return (
                "services.engine.kind=vllm needs vLLM: `uv sync --extra vllm` on a machine with a CUDA GPU, or "
                "choose services.engine.kind=local"
            )
        if settings.services.engine.vllm_quantization == "bitsandbytes" and not _runs_with(
            vllm, "vllm_bnb_plugin"
        ):
            return (
                "services.engine.vllm_quantization=bitsandbytes needs vllm-bnb-plugin where vLLM runs (vLLM 0.33 "
                f"moved bitsandbytes out of its core): `uv sync --extra vllm`, or `pip install vllm-bnb-plugin` "
                f"into the environment of {vllm}"
            )
        if not has_cuda_gpu():
            return (
                "services.engine.kind=vllm needs a CUDA GPU and none is visible here: run on a GPU machine, or "
                "choose services.engine.kind=local"
            )
    if kind == EngineKind.tinker and not os.environ.get("TINKER_API_KEY"):
        return (
            "the Tinker engine (trainer.provider=tinker or services.engine.kind=tinker) needs a Tinker API key: "
            "export TINKER_API_KEY=tml-… before `rollout up`"
        )
    return None


def _runs_with(script: str, module: str) -> bool:
    """Whether the Python that runs `script` (its `#!` line) can import `module`; True when `script` is not a
    Python script, which this cannot look into (a wrapper: what it runs is its own business)."""
    try:
        with open(script, "rb") as opened:
            first = opened.readline(512)
    except OSError:
        return True
    if not first.startswith(b"#!") or b"python" not in first:
        return True
    interpreter = first[2:].decode(errors="replace").split()
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:  # a find_spec, not an import: the plugin imports vLLM, which takes seconds
        done = subprocess.run([*interpreter, "-c", probe], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True  # vLLM itself will say what is wrong with its interpreter
    return done.returncode != 1


class EngineNotRunnableError(RuntimeError):
    """The configured engine cannot run on this machine; the message says what to do."""


def check_engine(settings: Settings) -> None:
    """Refuse, before the stack starts anything, an engine that cannot run here."""
    if settings.services.gateway.enabled and (problem := engine_problem(settings)) is not None:
        raise EngineNotRunnableError(problem)


def engine_overrides(settings: Settings) -> tuple[str, ...]:
    """The settings the engine process reads itself: services.engine.*, and the context vLLM is sized for."""
    engine = settings.services.engine
    out = [f"services.gateway.max_context={settings.services.gateway.max_context}"]
    for spec in fields(engine):
        value = getattr(engine, spec.name)
        if isinstance(value, list):
            text = json.dumps([str(item) for item in cast(list[object], value)])
        else:
            text = "null" if value is None else str(value.value if hasattr(value, "value") else value)
        out.append(f"services.engine.{spec.name}={text}")
    return tuple(out)
