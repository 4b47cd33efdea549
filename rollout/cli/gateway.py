"""`rollout gateway`: the gateway every agent loop samples through, recording every turn, with the operator
routes (seats, run control) an agent host on another machine uses."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollout.cli.common import Overrides, as_service, err, fail, load_settings
from rollout.control.connections import local_model

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout.config import TemporalSettings
    from rollout.workflows.run_types import RunChange

UPDATE_TIMEOUT_S = 60.0


class TemporalRunControl:
    """The gateway's run control: each operator action is the run workflow's update, as `rollout run` sends
    it. The Temporal client is made on first use, so a gateway starts (and serves turns) without Temporal."""

    def __init__(self, temporal: TemporalSettings, address: str) -> None:
        self.temporal, self.address = temporal, address
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    async def _connected(self) -> Client:
        from temporalio.client import Client

        from rollout.gateway.operator import RunControlError
        from rollout.temporal_tls import temporal_tls

        async with self._lock:
            if self._client is None:
                try:
                    self._client = await Client.connect(
                        self.address, namespace=self.temporal.namespace, tls=temporal_tls(self.temporal)
                    )
                except (RuntimeError, ValueError) as error:  # ValueError: a TLS file it cannot read
                    raise RunControlError(
                        503, f"Temporal at {self.address} is not answering: {error}"
                    ) from error
            return self._client

    async def _update(self, run: str, change: RunChange) -> Mapping[str, Any]:
        from temporalio.service import RPCError

        from rollout.gateway.operator import RunControlError
        from rollout.workflows.client import RunNotPlaying, RunUpdateRefused, update_run

        client = await self._connected()
        try:
            async with asyncio.timeout(UPDATE_TIMEOUT_S):
                return asdict(await update_run(client, run, change))
        except RunNotPlaying as error:
            raise RunControlError(404, str(error)) from error
        except RunUpdateRefused as error:
            raise RunControlError(409, f"run {run} refused {change.label}: {error}") from error
        except TimeoutError as error:
            raise RunControlError(
                503, f"run {run} did not take {change.label} within {UPDATE_TIMEOUT_S:.0f}s: is a runner up?"
            ) from error
        except RPCError as error:  # Temporal away or overloaded: the operator may send it again
            raise RunControlError(
                503, f"Temporal did not answer ({error.status.name.lower()}: {error.message}); try again"
            ) from error

    async def pause(self, run: str) -> Mapping[str, Any]:
        from rollout.workflows.run_types import PauseRun

        return await self._update(run, PauseRun())

    async def resume(self, run: str) -> Mapping[str, Any]:
        from rollout.workflows.run_types import ResumeRun

        return await self._update(run, ResumeRun())

    async def set_max_lag(self, run: str, max_lag: int) -> Mapping[str, Any]:
        from rollout.workflows.run_types import MaxLagChange

        return await self._update(run, MaxLagChange(max_lag))


def gateway(
    overrides: Overrides = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="The model the engines serve, its tokenizer and chat template (default: services.gateway.model)."
        ),
    ] = None,
    engine_url: Annotated[
        list[str] | None,
        typer.Option(
            "--engine-url",
            help="An engine speaking vLLM's dialect (repeatable; default: the stack's, at "
            "services.gateway.engine_host:engine_port).",
        ),
    ] = None,
    renderer: Annotated[str, typer.Option(help="auto, chatml, qwen3, or module.Class of your own.")] = "",
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default: services.gateway.host).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on (default: services.gateway.port).")
    ] = None,
    max_context: Annotated[
        int | None,
        typer.Option(help="The model's context length in tokens (default: services.gateway.max_context)."),
    ] = None,
    external: Annotated[
        list[str] | None,
        typer.Option(
            help="POLICY=MODEL or POLICY=MODEL@API_BASE: seats of POLICY use that LiteLLM model, recorded as text (repeatable)."
        ),
    ] = None,
) -> None:
    """Serve the gateway: OpenAI Chat, OpenAI Responses and Anthropic Messages, recording every turn.

    Point agents at a seat's base URL (`rollout seat new` prints one). A request body over
    `services.gateway.max_request_bytes` is refused with 413; `GET /openapi.json` describes what is accepted.
    Its operator routes (/operator/seats, /operator/runs/RUN/pause|resume|max_lag) need the key in
    DATA_DIR/operator.key. Listening on 127.0.0.1, it answers to loopback's Host names only. It reaches the
    engines with the engine API key of DATA_DIR/engine.key, which they share (`rollout engine api-key`).
    """
    from transformers import AutoTokenizer

    from rollout.config import LedgerWriter
    from rollout.gateway.assembly import parse_externals, serve_gateway
    from rollout.gateway.operator import OPERATOR_KEY_FILE, load_operator_key
    from rollout.gateway.seats import load_secret
    from rollout.ledger.errors import LedgerError
    from rollout.net import port_is_free
    from rollout.rendering import ModelRenderer, renderer_for_model
    from rollout.serving import engine_api_key, load_engine_key

    settings = load_settings(overrides)
    operator_key = load_operator_key(settings.data_path)
    seat_secret = load_secret(settings.data_path / "gateway.secret")
    engine_key = load_engine_key(settings.data_path)
    as_service(settings, operator_key, seat_secret, engine_api_key(engine_key))
    # What is not given is read from the settings: the embedded stack starts this command with its own.
    served = settings.services.gateway
    model = model or served.model
    host = host or served.host
    port = port or served.port
    max_context = max_context or served.max_context
    engine_url = engine_url or [f"http://{served.engine_host}:{served.engine_port}"]
    if not port_is_free(host, port):
        fail(f"port {port} on {host} is taken: choose another with `--port PORT`")
    try:
        externals = parse_externals(external or [])
    except ValueError as error:
        fail(str(error), code=2)

    def renderer_of(spec: str, name: str = "") -> ModelRenderer:
        # Another base model's (a policy on its own model, served by an engine whose signed ack names it).
        return ModelRenderer(
            AutoTokenizer.from_pretrained(local_model(spec, settings)), name or renderer_for_model(spec)
        )

    model_renderer = renderer_of(model, renderer)
    err.print(f"gateway on http://{host}:{port} → {', '.join(engine_url)}")
    for url in engine_url:
        if not _answers(url):  # it may be starting beside this gateway (`rollout up`): say so, do not stop
            err.print(
                f"no engine answers at {url} yet: turns wait for one (start it with `rollout engine serve`, or "
                "point the gateway elsewhere with --engine-url URL)",
                highlight=False,
            )
    err.print(f"operator routes need the key in {settings.data_path / OPERATOR_KEY_FILE}")
    try:
        asyncio.run(
            serve_gateway(
                ledger_url=settings.writer_ledger_url(LedgerWriter.gateway),
                renderer=model_renderer,
                model=model,
                renderers=renderer_of,
                engine_urls=engine_url,
                host=host,
                port=port,
                max_context=max_context,
                externals=externals,
                external_api_bases=served.external_api_bases,
                ack_key=engine_key,
                engine_api_key=engine_api_key(engine_key),
                max_request_bytes=settings.services.gateway.max_request_bytes,
                default_max_tokens=settings.services.gateway.default_max_tokens,
                max_turns_in_flight_per_seat=settings.services.gateway.max_turns_in_flight_per_seat,
                routing=settings.routing,
                operator_key=operator_key,
                seat_secret=seat_secret,
                runs=TemporalRunControl(settings.services.temporal, settings.temporal_address),
            )
        )
    except LedgerError as error:
        fail(str(error))


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def register(app: typer.Typer) -> None:
    app.command()(gateway)
