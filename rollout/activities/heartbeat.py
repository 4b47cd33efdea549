"""Heartbeats for activities whose work outlasts their heartbeat timeout.

Contract: inside `async with heartbeating():` the activity heartbeats every `every_s` seconds from a task on
its event loop (the work itself runs in threads or awaits), so Temporal takes the attempt for dead only when
its worker is; leaving the block stops the heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

EVERY_S = 2.0


@contextlib.asynccontextmanager
async def heartbeating(every_s: float = EVERY_S) -> AsyncIterator[None]:
    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every_s)

    beating = asyncio.create_task(beat())
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
