"""Ledger writers the concurrency tests run in child processes, each a fresh interpreter.

    python -m tests.ledger_writer overlap KEYS SEED STREAM...   # prints how many appends it made
    python -m tests.ledger_writer die STREAM KEY                # appends KEY, then SIGKILLs itself

The ledger's URL comes in `LEDGER_URL` (a password never goes in argv). A writer that has not finished after
`STUCK_S` dumps every thread's stack to stderr and exits, so a hang fails its test with where it hung.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import random
import signal
import sys

from rollout.ledger import Ledger, NewEvent

STUCK_S = 120


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


async def append_then_die(url: str, stream: str, key: str) -> None:
    async with await Ledger.connect(url) as ledger:
        await ledger.append_one(stream, NewEvent(key, "Test", {"key": key}))
        # Committed; die before anyone hears back, as a worker killed mid-activity would.
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    faulthandler.dump_traceback_later(STUCK_S, exit=True)
    url = os.environ["LEDGER_URL"]
    match argv:
        case ["overlap", keys, seed, *streams]:
            print(asyncio.run(write_overlapping(url, streams, int(keys), int(seed))))
        case ["die", stream, key]:
            asyncio.run(append_then_die(url, stream, key))
        case _:
            sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
