"""`rollout ledger tail`: a stream's events as JSON lines, once or following. `rollout ledger migrate`: the
ledger's schema brought to the newest migration."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated

import typer

from rollout.cli.common import Overrides, load_settings

app = typer.Typer(help="Look into the ledger: streams and their events.", no_args_is_help=True)


@app.command("tail")
def tail(
    stream: Annotated[str, typer.Argument(help="The stream to read, e.g. run/my-run.")],
    overrides: Overrides = None,
    after: Annotated[int, typer.Option(help="Start after this seq.")] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events as they arrive.")
    ] = False,
) -> None:
    """Print a stream's events as JSON lines (seq, key, kind, payload)."""
    from rollout.control.ledger import stream_events

    settings = load_settings(overrides)

    async def run() -> None:
        async for event in stream_events(
            settings, stream, after=after, follow=follow
        ):  # follow: until Ctrl-C
            print(json.dumps(event), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


@app.command("migrate")
def migrate_ledger(
    overrides: Overrides = None,
    wait_s: Annotated[
        float,
        typer.Option(help="How long to wait for Postgres to answer (a cluster's may still be starting)."),
    ] = 300.0,
) -> None:
    """Create the ledger's database if needed and bring its schema to the newest migration.

    Safe to run from several places at once (an advisory lock makes migrators take turns), and a no-op on a
    ledger that is current. The embedded stack runs it on `rollout up`; the chart's pods run it in an init
    container. Connects with services.postgres.url (the owner's: it may create tables).
    """
    from rollout.control.ledger import migrate

    print(f"ledger at schema {migrate(load_settings(overrides), wait_s)}", flush=True)
