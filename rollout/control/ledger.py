"""The ledger as calls: a stream's events read once or followed (`rollout ledger tail`), and its schema
brought to the newest migration (`rollout ledger migrate`).

Contract: `stream_events` yields each event of `stream` after `after` as a JSON-ready dict (seq, key, kind,
payload), the ones there now, or with `follow` every one as it arrives until the caller stops; a ledger that
cannot be reached is `Unreachable`. `migrate` waits up to `wait_s` for Postgres to answer, then brings the
schema to the head and answers its revision; Postgres still silent then is `Unreachable`, saying which setting
to check.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from rollout.control.connections import ledger_session
from rollout.control.errors import Unreachable

if TYPE_CHECKING:
    from rollout.config import Settings

type EventLine = dict[str, object]

MIGRATE_RETRY_S = 2.0


async def stream_events(
    settings: Settings, stream: str, *, after: int = 0, follow: bool = False
) -> AsyncIterator[EventLine]:
    from rollout.ledger.errors import LedgerError
    from rollout.ledger.follower import Follower

    if follow:
        try:
            async for event in Follower(settings.ledger_url, [stream], after={stream: after}).events():
                yield {"seq": event.seq, "key": event.key, "kind": event.kind, "payload": dict(event.payload)}
        except LedgerError as error:
            raise Unreachable(str(error)) from None
        return
    async with ledger_session(settings) as ledger:
        for event in await ledger.read(stream, after=after, limit=1_000_000):
            yield {"seq": event.seq, "key": event.key, "kind": event.kind, "payload": dict(event.payload)}


def migrate(settings: Settings, wait_s: float) -> str:
    from rollout.ledger import migrate as migrations
    from rollout.ledger.errors import LedgerUnreachableError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            migrations.upgrade(settings.ledger_url)
            return migrations.head_revision()
        except LedgerUnreachableError as error:
            if time.monotonic() > deadline:
                raise Unreachable(
                    f"{error}\nPostgres did not answer within {wait_s:.0f} s: check services.postgres.url."
                ) from None
            time.sleep(MIGRATE_RETRY_S)
