"""`rollout seat new`: a seat opened by hand, to point Claude Code, Codex or any client at a policy."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Annotated

import typer
from rich.console import Console

from rollout.cli.cluster import ClusterFlag, load_context
from rollout.cli.common import JsonFlag, Overrides, fail, load_settings
from rollout.security.redaction import unscrubbed

app = typer.Typer(help="Agent seats: the base URL and key an agent samples through.", no_args_is_help=True)


@app.command("new")
def new(
    overrides: Overrides = None,
    agent: Annotated[str, typer.Option(help="The agent's name.")] = "agent",
    run: Annotated[
        str | None, typer.Option(help="The run the seat belongs to (admission follows its settings).")
    ] = None,
    episode: Annotated[str | None, typer.Option(help="The episode the seat plays.")] = None,
    policy: Annotated[
        str, typer.Option(help="The policy whose newest admissible checkpoint serves it.")
    ] = "default",
    checkpoint: Annotated[str | None, typer.Option(help="Pin the seat to this checkpoint.")] = None,
    gateway_url: Annotated[
        str, typer.Option(help="The gateway the seat is used through.")
    ] = "http://127.0.0.1:8000",
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Open a seat by hand (to point Claude Code or Codex at a checkpoint, say): prints its base URL and key.
    With --cluster, the cluster's gateway opens it (its operator route, with the context's operator key)."""
    from rollout.control.connections import ledger_session
    from rollout.gateway.seats import load_secret, open_seat

    settings = load_settings(overrides)  # with --cluster the gateway opens the seat: these are not needed

    async def make() -> tuple[str, str]:
        async with ledger_session(settings) as ledger:
            seat, token = await open_seat(
                ledger,
                load_secret(settings.data_path / "gateway.secret"),
                seat_id=f"manual/{uuid.uuid4().hex[:12]}",
                agent=agent,
                policy=policy,
                run=run,
                episode=episode,
                checkpoint=checkpoint,
            )
        return seat.seat_id, token

    if cluster:
        gateway_url, seat_id, token = _open_on_cluster(
            {"agent": agent, "policy": policy, "run": run, "episode": episode, "checkpoint": checkpoint}
        )
    else:
        seat_id, token = asyncio.run(make())
    base_url = f"{gateway_url.rstrip('/')}/s/{token}/v1"
    # The one output that hands a seat's key out: it is written past the scrubbing every other output gets.
    clear = unscrubbed(sys.stdout)
    if as_json:
        print(json.dumps({"seat": seat_id, "base_url": base_url, "api_key": token}), file=clear, flush=True)
        return
    handed = Console(file=clear)
    handed.print(f"seat      {seat_id}\nbase URL  {base_url}\nAPI key   {token}", highlight=False)
    handed.print(
        f"Claude Code: ANTHROPIC_BASE_URL={gateway_url.rstrip('/')}/s/{token} ANTHROPIC_API_KEY={token} claude",
        highlight=False,
    )


def _open_on_cluster(fields: dict[str, str | None]) -> tuple[str, str, str]:
    """POST /operator/seats on the current cluster context's gateway: (gateway URL, seat id, key)."""
    import httpx

    context = load_context()
    if not context.gateway_url:
        fail(
            f"cluster {context.name} has no gateway URL: `rollout cluster connect {context.name} --gateway-url URL …`"
        )
    if not context.operator_key:  # every operator route needs it, wherever the gateway listens
        fail(
            f"cluster {context.name} keeps no operator key, which opening a seat needs: "
            f"`rollout cluster connect {context.name} --operator-key-file FILE …` (the chart's Secret, key "
            "operatorKey)"
        )
    headers = {"Authorization": f"Bearer {context.operator_key}"}
    url = f"{context.gateway_url.rstrip('/')}/operator/seats"
    try:
        answer = httpx.post(
            url, json={k: v for k, v in fields.items() if v is not None}, headers=headers, timeout=30
        )
    except httpx.HTTPError as error:
        fail(
            f"the cluster's gateway at {context.gateway_url} did not answer ({error}): `rollout status --cluster`"
        )
    if answer.status_code != 201:
        hint = (
            " (`rollout cluster connect … --operator-key-file FILE` keeps its key)"
            if answer.status_code in (401, 403)
            else ""
        )
        fail(f"the cluster's gateway refused the seat ({answer.status_code}: {answer.text[:300]}){hint}")
    body = answer.json()
    return context.gateway_url, str(body["seat"]), str(body["api_key"])
