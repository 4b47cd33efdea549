"""Engines by kind: build the engine `rollout engine serve` serves, and serve it beside its serving follower.

Contract:
- `ENGINE_KINDS` are the kinds that serve in process (`local`, `tinker`, `scripted`); `vllm` runs as its own
  `vllm serve` process (rollout.engines.vllm_launcher). `SERVED_FORMATS[kind]` are the checkpoint formats an
  engine of that kind loads, which its follower asks for.
- `build_engine` raises `EngineSetupError` with a message that says what to change (a missing script, key or
  extra); it never starts serving.
- `serve_engine` serves the engine over vLLM's HTTP dialect until cancelled (on a loopback host, to loopback's
  Host names only; every route but `/health` to holders of `api_key` only: rollout.engines.vllm_server); with
  a follower (which drives the engine in process), the follower reconnects to the ledger for as long as the
  engine serves (an unreachable ledger is reported and retried every 5 s, never fatal: the engine keeps
  serving what it holds).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rollout.blobs import BlobStore
from rollout.config.defaults import PREFIX_CACHE_MB
from rollout.engines.follower import FollowedEngine, FollowerConfig, ServingFollower
from rollout.engines.vllm_server import ServedEngine, build_app
from rollout.ledger import Ledger
from rollout.ledger.errors import LedgerError

ENGINE_KINDS = ("local", "tinker", "scripted")  # built here; vllm runs as `vllm serve`
SERVED_FORMATS: dict[str, tuple[str, ...]] = {
    "local": ("lora", "full"),
    "tinker": ("tinker",),
    "scripted": ("lora", "full", "tinker"),
    "vllm": ("lora",),  # runtime LoRA (VLLM_ALLOW_RUNTIME_LORA_UPDATING); full weights need a restart
}
log = logging.getLogger(__name__)


class EngineSetupError(ValueError):
    """The engine cannot be built as asked; the message says what to change."""


@dataclass(frozen=True)
class EngineSpec:
    """What to serve: the kind, the model (`model` as the user named it, `model_path` as resolved), and the
    options of each kind."""

    kind: str
    model: str
    model_path: str
    served_name: str = "base"
    device: str | None = None  # local
    prefix_cache_mb: int = PREFIX_CACHE_MB  # local: services.engine.prefix_cache_mb
    script: str | None = None  # scripted: package.module:function
    think_s: float = 0.0  # scripted
    tinker_base_model: str | None = None  # tinker (default: model)
    tinker_url: str | None = None  # tinker (default: $TINKER_BASE_URL, then Tinker's)

    def describe(self) -> str:
        if self.kind == "tinker":
            where = self.tinker_url or os.environ.get("TINKER_BASE_URL") or "Tinker"
            return f"Tinker engine sampling {self.tinker_base_model or self.model} at {where}"
        if self.kind == "scripted":
            return f"scripted engine ({self.script})"
        return f"local engine serving {self.model}"


def check_engine_options(kind: str, *, script: str | None) -> None:
    """Refuse, before anything loads, an engine that cannot start as asked."""
    if kind not in ENGINE_KINDS:
        raise EngineSetupError(f"engine kind must be one of {', '.join(ENGINE_KINDS)}, not {kind!r}")
    if kind == "scripted" and not script:
        raise EngineSetupError(
            "--kind scripted needs --script package.module:function (prompt text -> reply Message)"
        )
    if kind == "tinker" and not os.environ.get("TINKER_API_KEY"):
        raise EngineSetupError("--kind tinker needs a Tinker API key: export TINKER_API_KEY=tml-…")


def build_engine(spec: EngineSpec) -> ServedEngine:
    """The engine `spec` asks for, loaded and ready to serve."""
    check_engine_options(spec.kind, script=spec.script)
    if spec.kind == "tinker":
        from transformers import AutoTokenizer

        from rollout.engines.tinker import TinkerEngine

        return TinkerEngine(
            spec.tinker_base_model or spec.model,
            base_url=spec.tinker_url,
            served_name=spec.served_name,
            tokenizer=AutoTokenizer.from_pretrained(spec.model_path),
        )
    if spec.kind == "scripted":
        assert spec.script is not None  # checked above
        from transformers import AutoTokenizer

        from rollout.engines.scripted import ScriptedEngine, load_script
        from rollout.rendering import ModelRenderer, renderer_for_model

        try:
            reply = load_script(spec.script)
        except ValueError as error:
            raise EngineSetupError(str(error)) from error
        renderer = ModelRenderer(
            AutoTokenizer.from_pretrained(spec.model_path), renderer_for_model(spec.model)
        )
        return ScriptedEngine(renderer, reply, served_name=spec.served_name, think_s=spec.think_s)
    from rollout.engines.local import LocalEngine

    return LocalEngine(
        spec.model_path,
        device=spec.device,
        served_name=spec.served_name,
        prefix_cache_mb=spec.prefix_cache_mb,
    )


async def serve_engine(
    engine: ServedEngine,
    *,
    host: str,
    port: int,
    api_key: str,
    follower: FollowerConfig | None,
    ledger_url: str,
    store: Callable[[], BlobStore],
    cache_dir: Path,
    report: Callable[[str], None] = log.warning,
) -> None:
    """Serve `engine` on host:port to holders of `api_key` until cancelled, with its follower when one is
    configured."""
    import uvicorn

    following = (
        asyncio.create_task(follow_forever(engine, follower, ledger_url, store(), cache_dir, report))
        if follower is not None
        else None
    )
    try:
        await uvicorn.Server(
            uvicorn.Config(
                build_app(engine, api_key=api_key, host=host), host=host, port=port, log_level="warning"
            )
        ).serve()
    finally:
        if following is not None:
            following.cancel()


async def follow_forever(
    engine: FollowedEngine,
    config: FollowerConfig,
    ledger_url: str,
    store: BlobStore,
    cache_dir: Path,
    report: Callable[[str], None],
) -> None:
    """Keep `engine` following the ledger's serving targets until cancelled, across ledger outages."""
    while True:
        try:
            async with await Ledger.connect(ledger_url) as ledger:
                await ServingFollower(ledger, engine, store, config, cache_dir / config.engine).run()
        except LedgerError as error:
            report(f"serving follower: the ledger is unreachable ({error}); trying again in 5 s")
            await asyncio.sleep(5)
