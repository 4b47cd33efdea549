"""`rollout gateway`: the gateway every agent loop samples through, recording every turn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from rollout.cli.common import Overrides, err, fail, load_settings
from rollout.ledger.errors import LedgerError


def gateway(
    overrides: Overrides = None,
    model: Annotated[
        str, typer.Option(help="The model the engines serve (its tokenizer and chat template).")
    ] = "smollm2",
    engine_url: Annotated[
        list[str] | None, typer.Option("--engine-url", help="An engine speaking vLLM's dialect (repeatable).")
    ] = None,
    renderer: Annotated[str, typer.Option(help="auto, chatml, qwen3, or module.Class of your own.")] = "",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    max_context: Annotated[int, typer.Option(help="The model's context length in tokens.")] = 8192,
    external: Annotated[
        list[str] | None,
        typer.Option(
            help="POLICY=MODEL or POLICY=MODEL@API_BASE: seats of POLICY use that LiteLLM model, recorded as text (repeatable)."
        ),
    ] = None,
) -> None:
    """Serve the gateway: OpenAI Chat, OpenAI Responses and Anthropic Messages, recording every turn.

    Point agents at a seat's base URL (`rollout seat new` prints one).
    """
    from transformers import AutoTokenizer

    from rollout.engines.models import resolve
    from rollout.gateway.assembly import parse_externals, serve_gateway
    from rollout.net import port_is_free
    from rollout.rendering import ModelRenderer, renderer_for_model

    settings = load_settings(overrides)
    if not engine_url:
        fail(
            "the gateway needs at least one engine: start one with `rollout engine serve` and pass --engine-url URL"
        )
    if not port_is_free(host, port):
        fail(f"port {port} on {host} is taken: choose another with `--port PORT`")
    try:
        externals = parse_externals(external or [])
    except ValueError as error:
        fail(str(error), code=2)
    model_path = resolve(model, Path(settings.models_dir).expanduser())
    model_renderer = ModelRenderer(
        AutoTokenizer.from_pretrained(model_path), renderer or renderer_for_model(model)
    )
    err.print(f"gateway on http://{host}:{port} → {', '.join(engine_url)}")
    try:
        asyncio.run(
            serve_gateway(
                ledger_url=settings.worker_ledger_url,
                renderer=model_renderer,
                engine_urls=engine_url,
                host=host,
                port=port,
                max_context=max_context,
                externals=externals,
            )
        )
    except LedgerError as error:
        fail(str(error))


def register(app: typer.Typer) -> None:
    app.command()(gateway)
