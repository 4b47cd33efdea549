"""Projections: query-friendly tables derived from events inside the transaction that appends them.

Contract:
- A projector runs once per newly appended event (never for an idempotent retry that found its event),
  on the appending connection, inside the append's transaction: a projection is never behind its stream.
- Projectors only write projection tables; they never append events.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from rollout.ledger.events import Kind, RecordedEvent

Projector = Callable[[AsyncConnection, RecordedEvent], Awaitable[None]]


async def _run_created(conn: AsyncConnection, event: RecordedEvent) -> None:
    await conn.execute(
        "INSERT INTO run (run_id, environment, settings, created_at, updated_seq) VALUES (%s, %s, %s, %s, %s)",
        (event.payload["run"], event.payload["environment"], Jsonb(dict(event.payload.get("settings", {}))),
         event.recorded_at, event.seq),
    )  # fmt: skip


async def _settings_changed(conn: AsyncConnection, event: RecordedEvent) -> None:
    await conn.execute(
        "UPDATE run SET settings = settings || %s, updated_seq = %s WHERE run_id = %s",
        (Jsonb(dict(event.payload["changes"])), event.seq, event.payload["run"]),
    )


PROJECTORS: dict[str, Projector] = {
    Kind.RUN_CREATED: _run_created,
    Kind.SETTINGS_CHANGED: _settings_changed,
}


async def project(conn: AsyncConnection, events: list[RecordedEvent]) -> None:
    """Apply every projector to the events this append added."""
    for event in events:
        projector = PROJECTORS.get(event.kind)
        if event.appended and projector is not None:
            await projector(conn, event)
