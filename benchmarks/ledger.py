"""Ledger throughput: fenced idempotent appends against plain INSERTs into a same-shaped table.

Both sides run in the same process against the same throwaway embedded Postgres, interleaved round by
round, so the ratio is fair on a noisy machine. Scenarios: one writer appending one event per
transaction; one writer appending batches; eight concurrent writers appending batches (each to its own
stream, as the gateway's seats do). The baseline computes seq and the payload hash in the client and
inserts the same columns, with the same primary key and unique constraint, but no lock, no key lookup,
no fence and no projection. That baseline is the one place outside `rollout.ledger` that writes SQL: it
writes its own table (`plain_event`), never the ledger's, which it only appends to through `Ledger`.

Targets (issue 2): >= 5,000 fenced events/s batched, and fenced >= 50% of plain.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

from rollout.ledger import Ledger, NewEvent, migrate
from rollout.net import free_port
from rollout.stack.postgres import EmbeddedPostgres

PLAIN_TABLE = """
CREATE TABLE IF NOT EXISTS plain_event (
  stream_id text NOT NULL, seq bigint NOT NULL, idempotency_key text NOT NULL, epoch bigint NOT NULL,
  kind text NOT NULL, payload jsonb NOT NULL, payload_sha256 bytea NOT NULL,
  recorded_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (stream_id, seq), UNIQUE (stream_id, idempotency_key))
"""

PLAIN_INSERT = """
INSERT INTO plain_event (stream_id, seq, idempotency_key, epoch, kind, payload, payload_sha256)
SELECT %s, s, k, %s, kind, p, h FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::jsonb[], %s::bytea[])
    AS t(s, k, kind, p, h)
"""

BATCH = 100


def payload(i: int) -> dict[str, object]:
    return {"turn": i, "tokens": 128, "checkpoint": "ckpt-0007", "engine": "local", "reward": None}


class PlainWriter:
    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self.conn = conn
        self.heads: dict[str, int] = {}

    async def insert(self, stream: str, keys: list[str], payloads: list[dict[str, object]]) -> None:
        head = self.heads.get(stream, 0)
        seqs = list(range(head + 1, head + 1 + len(keys)))
        hashes = [hashlib.sha256(json.dumps(p, sort_keys=True).encode()).digest() for p in payloads]
        await self.conn.execute(
            PLAIN_INSERT, (stream, 1, seqs, keys, ["Turn"] * len(keys), [Jsonb(p) for p in payloads], hashes)
        )
        self.heads[stream] = head + len(keys)


async def fenced_writer(ledger: Ledger, stream: str, batches: int, batch: int) -> int:
    lease = await ledger.claim(f"{stream}/lease", "bench", ttl_s=600)
    assert lease is not None
    for b in range(batches):
        events = [NewEvent(f"{b}-{i}", "Turn", payload(i)) for i in range(batch)]
        await ledger.append(stream, events, fence=lease.fence)
    return batches * batch


async def plain_writer(url: str, stream: str, batches: int, batch: int) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        writer = PlainWriter(conn)
        for b in range(batches):
            await writer.insert(
                stream, [f"{b}-{i}" for i in range(batch)], [payload(i) for i in range(batch)]
            )
    return batches * batch


async def timed(run: Callable[[], Awaitable[int]]) -> float:
    start = time.perf_counter()
    events = await run()
    return events / (time.perf_counter() - start)


def scenarios(ledger: Ledger, url: str, tag: str, scale: int) -> dict[str, Callable[[], Awaitable[int]]]:
    """One round's scenarios, fenced and plain side by side, on streams no other round uses."""
    single_n, batched_n, concurrent_n = 40 * scale, 20 * scale, 5 * scale
    return {
        "fenced_single": lambda: fenced_writer(ledger, f"f1/{tag}", single_n, 1),
        "plain_single": lambda: plain_writer(url, f"p1/{tag}", single_n, 1),
        "fenced_batched": lambda: fenced_writer(ledger, f"fb/{tag}", batched_n, BATCH),
        "plain_batched": lambda: plain_writer(url, f"pb/{tag}", batched_n, BATCH),
        "fenced_8_writers": lambda: _sum(
            fenced_writer(ledger, f"f8/{tag}/{w}", concurrent_n, BATCH) for w in range(8)
        ),
        "plain_8_writers": lambda: _sum(
            plain_writer(url, f"p8/{tag}/{w}", concurrent_n, BATCH) for w in range(8)
        ),
    }


async def measure(url: str, rounds: int, scale: int) -> dict[str, float]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(PLAIN_TABLE)
    rates: dict[str, list[float]] = {}
    async with await Ledger.connect(url, max_size=10) as ledger:
        for _ in range(rounds):
            for name, run in scenarios(ledger, url, uuid.uuid4().hex[:8], scale).items():
                rates.setdefault(name, []).append(await timed(run))
    return {name: statistics.median(values) for name, values in rates.items()}


async def _sum(writers: Iterable[Awaitable[int]]) -> int:
    return sum(await asyncio.gather(*writers))


def main(quick: bool = False) -> int:
    rounds, scale = (1, 2) if quick else (3, 10)
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as data:
        postgres = EmbeddedPostgres(Path(data), "127.0.0.1", free_port())
        postgres.start()
        try:
            url = postgres.url("bench")
            migrate.upgrade(url)
            rates = asyncio.run(measure(url, rounds, scale))
        finally:
            postgres.stop()
    ratios = {s: rates[f"fenced_{s}"] / rates[f"plain_{s}"] for s in ("single", "batched", "8_writers")}
    result: dict[str, object] = {
        "benchmark": "ledger",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }
    result |= {f"{name}_events_per_s": round(rate) for name, rate in rates.items()}
    result |= {f"ratio_{name}": round(ratio, 3) for name, ratio in ratios.items()}
    result["target_batched_5000_met"] = rates["fenced_batched"] >= 5000
    result["target_ratio_50pct_met"] = ratios["batched"] >= 0.5 and ratios["8_writers"] >= 0.5
    for name, rate in rates.items():
        print(f"{name:>18}: {rate:10,.0f} events/s", file=sys.stderr)
    print(json.dumps(result))
    return 0
