"""The ledger client: fenced, idempotent appends; leases; reads by cursor.

Contract (see docs/ledger.md):
- `append` is exactly-once by `(stream, key)`: appending a key that is already there returns the recorded
  event (`appended=False`) and writes nothing; the same key with another payload raises `KeyConflictError`.
- A fenced append (`fence=`) is accepted only while the fence's epoch is the lease's current epoch and not
  below the stream's highest accepted epoch, and its secret is the one the lease was granted for (the
  database compares hashes); otherwise `StaleFenceError`, and nothing is written. The key
  is checked before the fence, so the retry of an append that committed under an old epoch still succeeds.
- Within a stream, `seq` is gap-free and follows commit order. A batch appends atomically.
- Projections are updated in the append's transaction, by triggers (see the first migration).
- Leases: every grant bumps the epoch; lease rows are never deleted, so epochs never repeat; a grant or
  renewal lasts a day at most (the database caps it). A live lease is renewed, released or granted again
  only for its holder's secret (`Lease.secret`; the database keeps its hash). An append holding no fence
  carries epoch 0 and the database refuses it on a stream a lease fences.
- A lost connection is not an error the caller sees while the server comes back within `reconnect_window_s`:
  the call is repeated on a fresh connection (safe: see `_using`); after that, `LedgerUnreachableError`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, LiteralString, Self

import psycopg
from psycopg.rows import TupleRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from rollout.ledger.errors import KeyConflictError, LedgerUnreachableError, translate
from rollout.ledger.events import Fence, Lease, NewEvent, RecordedEvent

# Leases change only through the ledger's functions (migration 0003): the worker role may call them, and may
# not UPDATE a lease row itself.
# Each carries the holder's secret (migration 0007): the ledger keeps its hash, and a live lease goes only to
# whoever presents it again.
_CLAIM = "SELECT resource, holder, epoch, expires_at FROM ledger_claim(%(resource)s, %(holder)s, %(ttl)s, %(secret)s)"

_RENEW = (
    "SELECT resource, holder, epoch, expires_at "
    "FROM ledger_renew(%(resource)s, %(holder)s, %(epoch)s, %(ttl)s, %(secret)s)"
)

log = logging.getLogger(__name__)

# How long a call waits for a lost database to come back (an embedded Postgres restarts in seconds).
RECONNECT_WINDOW_S = 120.0

type Connection = psycopg.AsyncConnection[TupleRow]
type QueryParams = Sequence[Any] | Mapping[str, Any]

# Parameters in binary (%b): arrays of keys, kinds and payloads go without text escaping, a quarter of a
# batch's time in the client (benchmarks/RESULTS.md, ledger).
_APPEND = "SELECT seq, idempotency_key, appended, recorded_at FROM ledger_append(%b, %b, %b, %b, %b, %b, %b)"

# Releasing expires the lease but keeps its row: the next grant continues from this epoch.
_RELEASE = "SELECT ledger_release(%(resource)s, %(holder)s, %(epoch)s, %(secret)s)"


class Ledger:
    """A pool of connections to the ledger database."""

    def __init__(
        self,
        url: str,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]],
        *,
        reconnect_window_s: float = RECONNECT_WINDOW_S,
    ) -> None:
        self.url = url
        self._pool = pool
        self.reconnect_window_s = reconnect_window_s

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout_s: float = 10,
        reconnect_window_s: float = RECONNECT_WINDOW_S,
    ) -> Ledger:
        """Open a pool; a server that cannot be reached raises `LedgerUnreachableError` naming the URL."""
        # One direct connection first: it fails fast with the server's own reason, where a pool only times
        # out.
        try:
            probe = await psycopg.AsyncConnection.connect(url, connect_timeout=int(timeout_s))
        except psycopg.OperationalError as error:
            raise LedgerUnreachableError(url, str(error)) from error
        await probe.close()
        pool = AsyncConnectionPool(
            url,
            connection_class=psycopg.AsyncConnection[TupleRow],
            min_size=min_size,
            max_size=max_size,
            open=False,
            kwargs={"autocommit": True},
        )
        try:
            await pool.open(wait=True, timeout=timeout_s)
        except PoolTimeout as error:
            await pool.close()
            raise LedgerUnreachableError(url, "the connection pool timed out") from error
        return cls(url, pool, reconnect_window_s=reconnect_window_s)

    async def close(self) -> None:
        await self._pool.close()

    async def _using[T](self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """Run `work` on a pooled connection; a lost connection (a restarted server, `AdminShutdown`, a
        refused connect) is retried on a fresh one with backoff until `reconnect_window_s` has passed, then
        raises `LedgerUnreachableError`. Every statement the ledger sends is safe to repeat: appends are
        idempotent by key, reads and lease updates by their arguments."""
        deadline = time.monotonic() + self.reconnect_window_s
        backoff = 0.1
        while True:
            try:
                async with self._pool.connection(timeout=max(1.0, deadline - time.monotonic())) as conn:
                    return await work(conn)
            except (psycopg.OperationalError, PoolTimeout) as error:
                if time.monotonic() + backoff > deadline:
                    raise LedgerUnreachableError(
                        self.url, str(error).strip() or type(error).__name__
                    ) from error
                log.info("ledger connection lost (%s); retrying in %.1fs", type(error).__name__, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def append(
        self, stream: str, events: Sequence[NewEvent], *, fence: Fence | None = None
    ) -> list[RecordedEvent]:
        """Append `events` to `stream` atomically, in order; return them as recorded (see the contract)."""
        if not events:
            return []
        params = _append_params(stream, _fold_repeated_keys(stream, events), fence)
        # One statement, one round trip: ledger_append locks, checks, inserts and projects in its transaction.

        async def work(conn: Connection) -> list[Any]:
            try:
                return await (await conn.execute(_APPEND, params)).fetchall()
            except psycopg.OperationalError:
                raise  # the connection, not the append: retried
            except psycopg.Error as error:
                raise translate(error) from error

        return _recorded(stream, events, await self._using(work))

    async def append_many(
        self, batches: Mapping[str, Sequence[NewEvent]], *, fence: Fence | None = None
    ) -> dict[str, list[RecordedEvent]]:
        """Append to several streams in one transaction and one round trip (a pipeline): all or nothing.

        Streams are locked in sorted order, so concurrent `append_many` calls cannot deadlock.
        """
        streams = sorted(stream for stream, events in batches.items() if events)
        plans = {stream: _fold_repeated_keys(stream, batches[stream]) for stream in streams}

        async def work(conn: Connection) -> dict[str, list[Any]]:
            try:
                async with conn.pipeline(), conn.transaction():
                    cursors = [
                        await conn.execute(_APPEND, _append_params(s, plans[s], fence)) for s in streams
                    ]
                return {
                    stream: await cursor.fetchall() for stream, cursor in zip(streams, cursors, strict=True)
                }
            except psycopg.OperationalError:
                raise  # the connection, not the append: retried (a batch that committed is found by its keys)
            except psycopg.Error as error:
                raise translate(error) from error

        rows = await self._using(work)
        return {stream: _recorded(stream, batches[stream], rows[stream]) for stream in streams}

    async def append_one(self, stream: str, event: NewEvent, *, fence: Fence | None = None) -> RecordedEvent:
        (recorded,) = await self.append(stream, [event], fence=fence)
        return recorded

    async def find(self, stream: str, key: str) -> RecordedEvent | None:
        """The event recorded under `key` on `stream`, if any."""

        async def work(conn: Connection) -> Any:
            cursor = await conn.execute(
                "SELECT seq, idempotency_key, kind, payload, recorded_at FROM event"
                " WHERE stream_id = %s AND idempotency_key = %s",
                (stream, key),
            )
            return await cursor.fetchone()

        row = await self._using(work)
        return (
            None
            if row is None
            else RecordedEvent(
                stream=stream,
                seq=row[0],
                key=row[1],
                kind=row[2],
                payload=row[3],
                recorded_at=row[4],
                appended=False,
            )
        )

    async def read(self, stream: str, *, after: int = 0, limit: int = 1000) -> list[RecordedEvent]:
        """Events of `stream` with `seq > after`, in order, at most `limit`."""
        return await self._using(lambda conn: read_stream(conn, stream, after=after, limit=limit))

    async def head(self, stream: str) -> int:
        """The stream's last seq (0 for a stream with no events)."""

        async def work(conn: Connection) -> Any:
            return await (
                await conn.execute("SELECT head_seq FROM stream WHERE stream_id = %s", (stream,))
            ).fetchone()

        row = await self._using(work)
        return row[0] if row else 0

    async def claim(
        self, resource: str, holder: str, ttl_s: float, *, secret: str | None = None
    ) -> Lease | None:
        """Take the lease on `resource` (a new, higher epoch) unless it is live: a live one only goes to the
        same holder presenting the `secret` it was granted with. `secret` (32 characters or more) is one the
        caller can make again, as a retried episode derives its own; without one, a fresh random one is made,
        and only this process's `Lease` holds it."""
        secret = secret or secrets.token_hex(32)
        params = {"resource": resource, "holder": holder, "ttl": timedelta(seconds=ttl_s), "secret": secret}
        return await self._lease_query(_CLAIM, params, secret)

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        """Extend a lease we hold; None when it was taken over (its epoch moved on)."""
        params = {
            "resource": lease.resource,
            "holder": lease.holder,
            "epoch": lease.epoch,
            "ttl": timedelta(seconds=ttl_s),
            "secret": lease.secret,
        }
        return await self._lease_query(_RENEW, params, lease.secret)

    async def release(self, lease: Lease) -> None:
        """Let the lease go now (it stays at its epoch; the next grant bumps it)."""
        params = {
            "resource": lease.resource,
            "holder": lease.holder,
            "epoch": lease.epoch,
            "secret": lease.secret,
        }
        await self._using(lambda conn: conn.execute(_RELEASE, params))

    async def _lease_query(self, query: LiteralString, params: dict[str, Any], secret: str) -> Lease | None:

        async def work(conn: Connection) -> Any:
            return await (await conn.execute(query, params)).fetchone()

        row = await self._using(work)
        return Lease(*row, secret=secret) if row else None

    # Read queries, for rollout.ledger.queries only: no SQL is sent to the ledger from outside this package.
    async def _fetch_all(self, query: LiteralString, params: QueryParams = ()) -> list[dict[str, Any]]:
        """Every row of a read-only query, as dicts."""

        async def work(conn: Connection) -> list[dict[str, Any]]:
            async with conn.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(query, params)
                return await cursor.fetchall()

        return await self._using(work)

    async def _fetch_one(self, query: LiteralString, params: QueryParams = ()) -> dict[str, Any] | None:
        """The first row of a read-only query, as a dict."""

        async def work(conn: Connection) -> dict[str, Any] | None:
            async with conn.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(query, params)
                return await cursor.fetchone()

        return await self._using(work)


async def read_stream(
    conn: psycopg.AsyncConnection, stream: str, *, after: int, limit: int
) -> list[RecordedEvent]:
    cursor = await conn.execute(
        "SELECT seq, idempotency_key, kind, payload, recorded_at FROM event"
        " WHERE stream_id = %s AND seq > %s ORDER BY seq LIMIT %s",
        (stream, after, limit),
    )
    return [
        RecordedEvent(stream=stream, seq=seq, key=key, kind=kind, payload=payload, recorded_at=at)
        for seq, key, kind, payload, at in await cursor.fetchall()
    ]


def _fold_repeated_keys(stream: str, events: Sequence[NewEvent]) -> list[NewEvent]:
    """The batch with each key once; a key repeated with another payload is a caller's bug."""
    first: dict[str, NewEvent] = {}
    for event in events:
        earlier = first.setdefault(event.key, event)
        if earlier is not event and (
            earlier.kind != event.kind or dict(earlier.payload) != dict(event.payload)
        ):
            raise KeyConflictError(
                f"idempotency key {event.key!r} appears twice in one append to stream {stream!r} with different payloads"
            )
    return list(first.values())


def _append_params(stream: str, unique: Sequence[NewEvent], fence: Fence | None) -> tuple[Any, ...]:
    return (
        stream,
        fence.resource if fence else None,
        fence.epoch if fence else 0,
        fence.secret if fence else None,
        [event.key for event in unique],
        [str(event.kind) for event in unique],
        [Jsonb(dict(event.payload)) for event in unique],
    )


def _recorded(
    stream: str, events: Sequence[NewEvent], rows: Sequence[tuple[Any, ...]]
) -> list[RecordedEvent]:
    """The caller's events, in its order, with what the ledger recorded for each key."""
    by_key = {key: (seq, appended, recorded_at) for seq, key, appended, recorded_at in rows}
    recorded: list[RecordedEvent] = []
    seen: set[str] = set()
    for event in events:
        seq, appended, recorded_at = by_key[event.key]
        # A key repeated within one batch is appended once: only its first copy counts.
        first = event.key not in seen
        seen.add(event.key)
        recorded.append(
            RecordedEvent(
                stream=stream,
                seq=seq,
                key=event.key,
                kind=event.kind,
                payload=event.payload,
                recorded_at=recorded_at,
                appended=appended and first,
            )
        )
    return recorded
