"""`rollout gateway`: the gateway every agent loop samples through, recording every turn, with the operator
routes (seats, run control) an agent host on another machine uses."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from rollout.cli.common import Overrides, as_service, err, fail, load_settings


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
    from rollout.config.catalog import ModelNotPulled
    from rollout.control.runs import OperatorRuns
    from rollout.gateway.startup import (
        GatewayAsked,
        GatewayOptionError,
        GatewayPortTaken,
        plan_gateway,
        serve_planned,
        silent_engines,
    )

    settings = load_settings(overrides)
    asked = GatewayAsked(
        model=model,
        engine_urls=engine_url or (),
        renderer=renderer,
        host=host,
        port=port,
        max_context=max_context,
        externals=external or (),
    )
    try:
        plan = plan_gateway(settings, asked)
    except GatewayOptionError as error:
        fail(str(error), code=2)
    except (GatewayPortTaken, ModelNotPulled) as error:
        fail(str(error))
    as_service(settings, *plan.secrets)
    err.print(f"gateway on http://{plan.host}:{plan.port} → {', '.join(plan.engine_urls)}")
    for url in silent_engines(plan):  # it may be starting beside this gateway (`rollout up`): say so, go on
        err.print(
            f"no engine answers at {url} yet: turns wait for one (start it with `rollout engine serve`, or "
            "point the gateway elsewhere with --engine-url URL)",
            highlight=False,
        )
    err.print(f"operator routes need the key in {plan.operator_key_file}")
    # A ledger that cannot be reached is one paragraph (rollout.cli.app.main), as for any command.
    asyncio.run(serve_planned(plan, OperatorRuns(settings)))


def register(app: typer.Typer) -> None:
    app.command()(gateway)
