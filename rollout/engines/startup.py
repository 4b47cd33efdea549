"""An engine started from settings: what `rollout engine serve` (and the embedded stack, which runs that
command) serves, each choice the command line left open read from `services.gateway`, `services.engine` and
`trainer.*`.

Contract:
- `EngineAsked` is what the command line asked; an empty field takes its setting's value.
- `engine_kind(settings, asked)` is the kind to serve (`services.engine.kind`, auto: tinker when the trainer
  is Tinker's, else local); one that is none of local, vllm, tinker, scripted raises `EngineSetupError`.
- `plan_engine(settings, asked)` checks the options (`EngineSetupError`: a scripted engine without a script,
  Tinker without its key, vLLM not installed), the port (`EnginePortTaken`) and the model (its local path; one
  not pulled raises rollout.config.catalog.ModelNotPulled), and returns an `EnginePlan` with the data
  directory's engine key and the follower's configuration (None with `follow=False`). Nothing is loaded yet.
- `serve_planned(plan, engine, store, report)` serves an engine `build_engine(plan.spec)` built until
  cancelled; `serve_planned_vllm(plan, store, report)` runs `vllm serve` with the follower beside it,
  answering its exit status (`VLLMStartError` when it never started).
- `plan_follower(settings, asked)` is `rollout engine follow`'s: the follower of an engine started elsewhere
  (vllm, local or tinker, at an http(s) URL; `EngineSetupError` otherwise); `follow_planned(plan, store,
  report)` follows it until cancelled.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollout.blobs import BlobStore
from rollout.config import LedgerWriter, Settings
from rollout.engines.factory import SERVED_FORMATS, EngineSetupError, EngineSpec, check_engine_options
from rollout.engines.follower import FollowerConfig
from rollout.engines.vllm_server import ServedEngine
from rollout.net import port_is_free, reachable_host
from rollout.serving.keys import engine_api_key, load_engine_key

KINDS = (*SERVED_FORMATS,)  # local, tinker, scripted, vllm


class EnginePortTaken(RuntimeError):
    """The port the engine would listen on is held by another process."""


@dataclass(frozen=True)
class EngineAsked:
    """What `rollout engine serve` was asked; an empty field takes its setting's value."""

    kind: str | None = None
    model: str | None = None
    """smollm2, tiny-qwen3, an HF model id or a local path (default: services.gateway.model)."""
    host: str | None = None
    port: int | None = None
    device: str | None = None
    """cpu or cuda (default: services.engine.device, else cuda when there is one)."""
    served_name: str = "base"
    script: str | None = None
    """scripted: package.module:function, mapping the prompt's text to the reply Message."""
    think_ms: float = 0.0
    """scripted: how long each reply takes."""
    tinker_base_model: str | None = None
    tinker_url: str | None = None
    name: str | None = None
    """The engine's name in serving acks (default: engine-PORT)."""
    follow: bool = True
    """Run the serving follower beside the engine."""
    gpu: str | None = None
    """One-GPU mode: the GPU lease to sleep under (default: the stack's, with gpu.mode=shared)."""


@dataclass(frozen=True)
class EnginePlan:
    """An engine resolved from settings and the command line; `spec` is what `build_engine` loads (the vLLM
    kind runs `vllm serve` from `model_path` instead)."""

    settings: Settings
    kind: str
    spec: EngineSpec
    host: str
    port: int
    follower: FollowerConfig | None
    engine_key: bytes = field(repr=False)

    @property
    def api_key(self) -> str:
        return engine_api_key(self.engine_key)


def engine_kind(settings: Settings, asked: EngineAsked) -> str:
    kind = asked.kind or settings.engine_kind.value
    if kind not in KINDS:
        raise EngineSetupError(f"--kind must be local, vllm, tinker or scripted, not {kind!r}")
    return kind


def plan_engine(settings: Settings, asked: EngineAsked) -> EnginePlan:
    from rollout.engines.models import resolve

    gateway, trainer = settings.services.gateway, settings.trainer
    kind = engine_kind(settings, asked)
    if kind == "vllm":
        if shutil.which("vllm") is None:
            raise EngineSetupError("vLLM is not installed here: `uv sync --extra vllm` (it needs a CUDA GPU)")
    else:
        check_engine_options(kind, script=asked.script)
    host = asked.host or gateway.engine_host
    port = asked.port or gateway.engine_port
    if not port_is_free(host, port):
        raise EnginePortTaken(f"port {port} on {host} is taken: choose another with `--port PORT`")
    model = asked.model or gateway.model
    engine_key = load_engine_key(settings.data_path)
    follower = FollowerConfig(
        engine=asked.name or f"engine-{port}",
        url=f"http://{reachable_host(host)}:{port}",  # where the gateway reaches it, read from its acks
        base=asked.served_name,
        model=model,
        formats=SERVED_FORMATS[kind],
        opponent_adapters=settings.services.engine.opponent_adapters,
        gpu=asked.gpu or settings.gpu_lease,  # gpu.mode=shared gives way to the stack's GPU lease
        ack_key=engine_key,
    )
    spec = EngineSpec(
        kind=kind,
        model=model,
        model_path=resolve(model, Path(settings.models_dir).expanduser()),
        served_name=asked.served_name,
        device=asked.device or settings.services.engine.device,
        prefix_cache_mb=settings.services.engine.prefix_cache_mb,
        script=asked.script,
        think_s=asked.think_ms / 1000,
        tinker_base_model=asked.tinker_base_model or trainer.tinker_base_model,
        tinker_url=asked.tinker_url or trainer.tinker_url,
    )
    return EnginePlan(settings, kind, spec, host, port, follower if asked.follow else None, engine_key)


async def serve_planned(
    plan: EnginePlan,
    engine: ServedEngine,
    store: Callable[[], BlobStore],
    report: Callable[[str], None],
) -> None:
    from rollout.engines.factory import serve_engine

    await serve_engine(
        engine,
        host=plan.host,
        port=plan.port,
        api_key=plan.api_key,
        follower=plan.follower,
        ledger_url=plan.settings.writer_ledger_url(LedgerWriter.serving),
        store=store,
        cache_dir=plan.settings.data_path / "engines",
        report=report,
    )


def vllm_log(plan: EnginePlan) -> Path:
    return plan.settings.data_path / "logs" / f"vllm-{plan.port}.log"


async def serve_planned_vllm(
    plan: EnginePlan, store: Callable[[], BlobStore], report: Callable[[str], None]
) -> int:
    from rollout.engines.vllm_launcher import launch_for
    from rollout.engines.vllm_process import serve_vllm

    settings, spec = plan.settings, plan.spec
    launch = launch_for(
        settings,
        spec.model_path,
        host=plan.host,
        port=plan.port,
        served_name=spec.served_name,
        api_key=plan.api_key,
    )
    return await serve_vllm(
        launch,
        follower=plan.follower,
        ledger_url=settings.writer_ledger_url(LedgerWriter.serving),
        store=store,
        cache_dir=settings.data_path / "engines",
        log_path=vllm_log(plan),
        report=report,
    )


@dataclass(frozen=True)
class FollowAsked:
    """What `rollout engine follow` was asked."""

    engine_url: str
    kind: str = "vllm"
    """What the engine is: vllm, local or tinker (which checkpoint formats it loads)."""
    name: str | None = None
    served_name: str = "base"
    model: str | None = None
    """The base model it serves (default: services.gateway.model)."""
    gpu: str | None = None
    runs: tuple[str, ...] = ()
    """Serve only these runs' checkpoints; () serves every run's."""


@dataclass(frozen=True)
class FollowPlan:
    settings: Settings
    engine_url: str
    config: FollowerConfig
    engine_key: bytes = field(repr=False)

    @property
    def api_key(self) -> str:
        return engine_api_key(self.engine_key)


def plan_follower(settings: Settings, asked: FollowAsked) -> FollowPlan:
    from urllib.parse import urlsplit

    if asked.kind not in SERVED_FORMATS or asked.kind == "scripted":
        raise EngineSetupError(f"--kind must be vllm, local or tinker, not {asked.kind!r}")
    address = urlsplit(asked.engine_url)
    if address.scheme not in ("http", "https") or not address.hostname:
        raise EngineSetupError(
            f"--engine-url must be an http(s) URL such as http://127.0.0.1:8100, not {asked.engine_url!r}"
        )
    engine_key = load_engine_key(settings.data_path)
    config = FollowerConfig(
        engine=asked.name or f"engine-{address.port or 80}",
        url=asked.engine_url.rstrip("/"),
        base=asked.served_name,
        model=asked.model or settings.services.gateway.model,
        formats=SERVED_FORMATS[asked.kind],
        opponent_adapters=settings.services.engine.opponent_adapters,
        gpu=asked.gpu,
        runs=asked.runs,
        ack_key=engine_key,
    )
    return FollowPlan(settings, asked.engine_url, config, engine_key)


async def follow_planned(
    plan: FollowPlan, store: Callable[[], BlobStore], report: Callable[[str], None]
) -> None:
    from rollout.engines.factory import follow_forever
    from rollout.engines.vllm_client import VLLMEngine

    engine = VLLMEngine(plan.engine_url, api_key=plan.api_key, name=plan.config.engine)
    try:
        await follow_forever(
            engine,
            plan.config,
            plan.settings.writer_ledger_url(LedgerWriter.serving),
            store(),
            plan.settings.data_path / "engines",
            report,
        )
    finally:
        await engine.close()
