"""The gateway started from settings: what `rollout gateway` (and the embedded stack, which runs that command)
serves, each choice the command line left open read from `services.gateway`.

Contract:
- `GatewayAsked` is what the command line asked; every field left empty takes its setting's value.
- `plan_gateway(settings, asked)` resolves it into a `GatewayPlan` with the data directory's keys (operator
  key, seat secret, engine key, each made once if missing) and the model's local path (a built-in one made
  once; one not pulled raises rollout.config.catalog.ModelNotPulled, saying how to pull it). A malformed
  `--external` raises `GatewayOptionError`; a port another process holds raises `GatewayPortTaken`, saying how
  to choose another. Nothing is served yet.
- `silent_engines(plan)` names the engine URLs that do not answer /health yet (one may be starting beside
  the gateway: turns wait for it).
- `serve_planned(plan, runs)` loads the model's renderer (and another base model's when a seat needs it)
  and serves until cancelled (rollout.gateway.assembly.serve_gateway), with `runs` behind the operator
  routes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rollout.config import LedgerWriter, Settings
from rollout.engines.external import ExternalModel
from rollout.gateway.assembly import parse_externals, serve_gateway
from rollout.gateway.operator import OPERATOR_KEY_FILE, RunControl, load_operator_key
from rollout.gateway.seats import load_secret
from rollout.net import port_is_free
from rollout.rendering import ModelRenderer, renderer_for_model
from rollout.serving.keys import engine_api_key, load_engine_key

SEAT_SECRET_FILE = "gateway.secret"


class GatewayOptionError(ValueError):
    """An option the gateway cannot start with; the message says how to write it."""


class GatewayPortTaken(RuntimeError):
    """The port the gateway would listen on is held by another process."""


@dataclass(frozen=True)
class GatewayAsked:
    """What `rollout gateway` was asked; an empty field takes its `services.gateway` setting."""

    model: str | None = None
    """The model the engines serve, its tokenizer and chat template."""
    engine_urls: Sequence[str] = ()
    """Engines speaking vLLM's dialect (default: the stack's, at engine_host:engine_port)."""
    renderer: str = ""
    """auto (empty), chatml, qwen3, or module.Class."""
    host: str | None = None
    port: int | None = None
    max_context: int | None = None
    """The model's context length in tokens."""
    externals: Sequence[str] = ()
    """POLICY=MODEL[@API_BASE] specs: seats of POLICY use that LiteLLM model."""


@dataclass(frozen=True)
class GatewayPlan:
    """A gateway resolved from settings and the command line, with its keys; `secrets` are what its logs
    must never show."""

    settings: Settings
    model: str
    model_path: str
    engine_urls: tuple[str, ...]
    renderer: str
    host: str
    port: int
    max_context: int
    externals: dict[str, ExternalModel]
    operator_key: str
    seat_secret: bytes
    engine_key: bytes
    secrets: tuple[str | bytes, ...] = field(repr=False, default=())

    @property
    def operator_key_file(self) -> Path:
        return self.settings.data_path / OPERATOR_KEY_FILE


def plan_gateway(settings: Settings, asked: GatewayAsked) -> GatewayPlan:
    served = settings.services.gateway
    host = asked.host or served.host
    port = asked.port or served.port
    try:
        externals = parse_externals(asked.externals)
    except ValueError as error:
        raise GatewayOptionError(str(error)) from None
    if not port_is_free(host, port):
        raise GatewayPortTaken(f"port {port} on {host} is taken: choose another with `--port PORT`")
    model = asked.model or served.model
    model_path = local_model(model, settings)
    operator_key = load_operator_key(settings.data_path)
    seat_secret = load_secret(settings.data_path / SEAT_SECRET_FILE)
    engine_key = load_engine_key(settings.data_path)
    return GatewayPlan(
        settings=settings,
        model=model,
        model_path=model_path,
        engine_urls=tuple(asked.engine_urls) or (f"http://{served.engine_host}:{served.engine_port}",),
        renderer=asked.renderer,
        host=host,
        port=port,
        max_context=asked.max_context or served.max_context,
        externals=externals,
        operator_key=operator_key,
        seat_secret=seat_secret,
        engine_key=engine_key,
        secrets=(operator_key, seat_secret, engine_api_key(engine_key)),
    )


def local_model(spec: str, settings: Settings) -> str:
    from rollout.engines.models import resolve

    return resolve(spec, Path(settings.models_dir).expanduser())


def silent_engines(plan: GatewayPlan) -> list[str]:
    return [url for url in plan.engine_urls if not _answers(url)]


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


async def serve_planned(plan: GatewayPlan, runs: RunControl) -> None:
    from transformers import AutoTokenizer

    settings, served = plan.settings, plan.settings.services.gateway

    def renderer_of(spec: str, name: str = "", path: str = "") -> ModelRenderer:
        # Another base model's too (a policy on its own model, served by an engine whose signed ack names it).
        local = path or local_model(spec, settings)
        return ModelRenderer(AutoTokenizer.from_pretrained(local), name or renderer_for_model(spec))

    await serve_gateway(
        ledger_url=settings.writer_ledger_url(LedgerWriter.gateway),
        renderer=renderer_of(plan.model, plan.renderer, plan.model_path),
        model=plan.model,
        renderers=renderer_of,
        engine_urls=plan.engine_urls,
        host=plan.host,
        port=plan.port,
        max_context=plan.max_context,
        externals=plan.externals,
        external_api_bases=served.external_api_bases,
        ack_key=plan.engine_key,
        engine_api_key=engine_api_key(plan.engine_key),
        max_request_bytes=served.max_request_bytes,
        default_max_tokens=served.default_max_tokens,
        max_turns_in_flight_per_seat=served.max_turns_in_flight_per_seat,
        routing=settings.routing,
        operator_key=plan.operator_key,
        seat_secret=plan.seat_secret,
        runs=runs,
    )
