"""A ledger writer run in child processes by the concurrency tests (spawned, so it imports only this)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

from rollout.ledger import Ledger, NewEvent


async def write_overlapping(url: str, streams: list[str], keys: int, seed: int) -> int:
    """Append every key of every stream once, in a random order and random batches; return appends made."""
    rng = random.Random(seed)
    plan = [(stream, k) for stream in streams for k in range(keys)]
    rng.shuffle(plan)
    appended = 0
    async with await Ledger.connect(url, max_size=2) as ledger:
        while plan:
            size = rng.randint(1, 8)
            batch, plan = plan[:size], plan[size:]
            for stream in {s for s, _ in batch}:
                events = [NewEvent(f"k{k}", "Test", {"k": k}) for s, k in batch if s == stream]
                appended += sum(e.appended for e in await ledger.append(stream, events))
    return appended


def process_main(url: str, streams: list[str], keys: int, seed: int) -> int:
    return asyncio.run(write_overlapping(url, streams, keys, seed))


async def append_then_die(url: str, stream: str, key: str) -> None:
    async with await Ledger.connect(url) as ledger:
        await ledger.append_one(stream, NewEvent(key, "Test", {"key": key}))
        # Committed; die before anyone hears back, as a worker killed mid-activity would.
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    asyncio.run(append_then_die(sys.argv[1], sys.argv[2], sys.argv[3]))
