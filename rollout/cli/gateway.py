"""`rollout gateway`: the gateway every agent loop samples through, recording every turn, with the operator
routes (seats, run control) an agent host on another machine uses."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from rollout.cli.common import Overrides, as_service, err, fail, load_settings
from rollout.control.connections import local_model


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
    from rollout.control.runs import OperatorRuns
    from rollout.gateway.assembly import parse_externals, serve_gateway
    from rollout.gateway.operator import OPERATOR_KEY_FILE, load_operator_key
    from rollout.gateway.seats import load_secret
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
    # A ledger that cannot be reached is one paragraph (rollout.cli.app.main), as for any command.
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
            runs=OperatorRuns(settings),
        )
    )


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def register(app: typer.Typer) -> None:
    app.command()(gateway)
