"""Followers: read streams by cursor, woken by LISTEN/NOTIFY, correct across reconnects.

Contract:
- A follower yields every event of its streams exactly once, in `seq` order per stream, starting after the
  cursors it was given. It never trusts a notification for content: NOTIFY only wakes it; it then reads by
  cursor. It also reads on a timer, and after every reconnect, so a lost notification (a disconnect, a
  server restart) delays an event by at most `poll_interval_s` and never loses it.
- Connection failures are retried with backoff for as long as the follower runs; the cursor survives them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping

import psycopg

from rollout.ledger.events import RecordedEvent
from rollout.ledger.store import read_stream

log = logging.getLogger(__name__)

CHANNEL = "ledger"


class Follower:
    """Follow a set of streams from given cursors (`after[stream]`, default 0)."""

    def __init__(
        self,
        url: str,
        streams: Iterable[str],
        *,
        after: Mapping[str, int] | None = None,
        poll_interval_s: float = 1.0,
        batch: int = 1000,
    ) -> None:
        self.url = url
        self.cursors: dict[str, int] = {stream: (after or {}).get(stream, 0) for stream in streams}
        self.poll_interval_s = poll_interval_s
        self.batch = batch
        self.reconnects = 0

    async def events(self) -> AsyncIterator[RecordedEvent]:
        """Yield events forever (cancel the consuming task, or break, to stop)."""
        backoff = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=5
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    backoff = 0.1
                    while True:
                        # Drain by cursor first: covers events committed while we were away or asleep.
                        async for event in self._drain(conn):
                            yield event
                        await self._wait(conn)
            except psycopg.OperationalError as error:
                self.reconnects += 1
                log.info("ledger follower lost its connection (%s); reconnecting in %.1fs", error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _drain(self, conn: psycopg.AsyncConnection) -> AsyncIterator[RecordedEvent]:
        for stream in self.cursors:
            while True:
                events = await read_stream(conn, stream, after=self.cursors[stream], limit=self.batch)
                for event in events:
                    self.cursors[stream] = event.seq
                    yield event
                if len(events) < self.batch:
                    break

    async def _wait(self, conn: psycopg.AsyncConnection) -> None:
        """Return on the first notification for one of our streams, or after the poll interval."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.poll_interval_s
        while (remaining := deadline - loop.time()) > 0:
            async for notify in conn.notifies(timeout=remaining, stop_after=1):
                if notify.payload.rpartition(":")[0] in self.cursors:
                    return
