"""`rollout seat new`: a seat opened by hand, to point Claude Code, Codex or any client at a policy."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Annotated

import typer
from rich.console import Console

from rollout.cli.common import JsonFlag, Overrides, fail, load_settings
from rollout.ledger.errors import LedgerError
from rollout.redaction import unscrubbed

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
    as_json: JsonFlag = False,
) -> None:
    """Open a seat by hand (to point Claude Code or Codex at a checkpoint, say): prints its base URL and key."""
    from rollout.gateway.seats import load_secret, open_seat
    from rollout.ledger import Ledger

    settings = load_settings(overrides)

    async def make() -> tuple[str, str]:
        async with await Ledger.connect(settings.ledger_url) as ledger:
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

    try:
        seat_id, token = asyncio.run(make())
    except LedgerError as error:
        fail(str(error))
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
