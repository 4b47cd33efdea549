"""Heartbeats for activities whose work outlasts their heartbeat timeout.

Contract: inside `async with heartbeating():` the activity heartbeats from a task on its event loop (the work
itself runs in threads or awaits), so Temporal takes the attempt for dead only when its worker is; leaving the
block stops the heartbeats. It beats as often as its heartbeat timeout needs and no more: `BEATS_PER_TIMEOUT`
times per timeout (every 10 s for the workflows' 30 s), or every `every_s` when given. A beat is a call into
the worker, which sends Temporal at most one per 80% of the timeout whatever the rate: beating faster only
costs the worker's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

BEATS_PER_TIMEOUT = 3
WITHOUT_TIMEOUT_S = 10.0  # an activity started with no heartbeat timeout: nothing waits on its beats


def beat_interval_s() -> float:
    """Seconds between beats for the running activity: a third of its heartbeat timeout."""
    timeout = activity.info().heartbeat_timeout
    if timeout is None or timeout.total_seconds() <= 0:
        return WITHOUT_TIMEOUT_S
    return timeout.total_seconds() / BEATS_PER_TIMEOUT


@contextlib.asynccontextmanager
async def heartbeating(every_s: float | None = None) -> AsyncIterator[None]:
    interval = beat_interval_s() if every_s is None else every_s

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval)

    beating = asyncio.create_task(beat())
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
