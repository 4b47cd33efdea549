"""Whether the engine the embedded stack would start for its gateway can run on this machine.

Contract:
- The engine is the stack's `Engine` role (rollout.stack.roles): `rollout engine serve` reads its kind
  (`settings.engine_kind`: local, vllm or tinker), model, address, device and GPU lease from the settings.
- `engine_problem(settings)` says, in one line, why that engine cannot run here (vllm without the `vllm`
  extra, a bitsandbytes base without `vllm-bnb-plugin` in the Python that runs `vllm`, vllm without a CUDA
  GPU, tinker without TINKER_API_KEY) and what to do instead; None when it can. The stack checks it
  (`check_engine`, raising `EngineNotRunnableError`) before it starts anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from rollout.config import EngineKind, Settings


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
