"""`rollout ledger tail`: a stream's events as JSON lines, once or following. `rollout ledger migrate`: the
ledger's schema brought to the newest migration."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from rollout.cli.common import Overrides, fail, load_settings

app = typer.Typer(help="Look into the ledger: streams and their events.", no_args_is_help=True)


def _print_event(seq: int, key: str, kind: str, payload: dict[str, object]) -> None:
    print(json.dumps({"seq": seq, "key": key, "kind": kind, "payload": payload}), flush=True)


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
    from rollout.ledger import Ledger
    from rollout.ledger.errors import LedgerError
    from rollout.ledger.follower import Follower

    url = load_settings(overrides).ledger_url

    async def run() -> None:
        if follow:  # runs until interrupted
            async for event in Follower(url, [stream], after={stream: after}).events():
                _print_event(event.seq, event.key, event.kind, dict(event.payload))
            return
        async with await Ledger.connect(url) as ledger:
            for event in await ledger.read(stream, after=after, limit=1_000_000):
                _print_event(event.seq, event.key, event.kind, dict(event.payload))

    try:
        asyncio.run(run())
    except LedgerError as error:
        fail(str(error))
    except KeyboardInterrupt:
        pass


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
    import time

    from rollout.ledger import migrate
    from rollout.ledger.errors import LedgerUnreachableError

    settings = load_settings(overrides)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            migrate.upgrade(settings.ledger_url)
            break
        except LedgerUnreachableError as error:
            if time.monotonic() > deadline:
                fail(f"{error}\nPostgres did not answer within {wait_s:.0f} s: check services.postgres.url.")
            time.sleep(2.0)
    print(f"ledger at schema {migrate.head_revision()}", flush=True)
