"""The trainer lease of each policy a trainer worker trains (`trainer/{policy}`), shared by every provider.

Contract:
- `hold(policy)` renews the lease this worker holds or claims it; while another holder's lease is live it
  waits (heartbeating) up to one TTL for it to lapse (a dead trainer's does), then fails the step to retry
  later (`ApplicationError`, retryable). It answers whether the epoch is new: whatever the worker had in
  memory for the policy (a model at some checkpoint) may then be stale, since another holder may have trained.
- `kept(policy)` heartbeats the activity and renews the lease while a step runs, often enough for both the
  activity's heartbeat timeout and the lease's TTL; once a renewal fails it stops, and the step's fenced
  publish (`fence(policy)`) is refused: a zombie attempt cannot publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollout.ledger import Fence, Lease, Ledger
from rollout.ledger.streams import trainer_lease

LEASE_TTL_S = 60.0


class PolicyLeases:
    def __init__(self, ledger: Ledger, holder: str, ttl_s: float = LEASE_TTL_S) -> None:
        self.ledger, self.holder, self.ttl_s = ledger, holder, ttl_s
        self.held: dict[str, Lease] = {}

    async def hold(self, policy: str) -> bool:
        """Hold `policy`'s lease; True when it is a new epoch for this worker."""
        held = self.held.get(policy)
        lease = await self.ledger.renew(held, self.ttl_s) if held else None
        deadline = time.monotonic() + self.ttl_s + 5.0
        while lease is None:
            lease = await self.ledger.claim(trainer_lease(policy), self.holder, self.ttl_s)
            if lease is not None:
                break
            if time.monotonic() > deadline:
                raise ApplicationError(
                    f"another trainer holds policy {policy!r}; retrying when its lease lapses"
                )
            if activity.in_activity():
                activity.heartbeat()
            await asyncio.sleep(1.0)
        self.held[policy] = lease
        return held is None or lease.epoch != held.epoch

    def fence(self, policy: str) -> Fence:
        return self.held[policy].fence

    @contextlib.asynccontextmanager
    async def kept(self, policy: str) -> AsyncIterator[None]:
        keeping = asyncio.create_task(self._keep(policy))
        try:
            yield
        finally:
            keeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeping

    async def _keep(self, policy: str) -> None:
        timeout = activity.info().heartbeat_timeout
        every = min(self.ttl_s / 4, 10.0, timeout.total_seconds() / 3 if timeout else 10.0)
        while True:
            activity.heartbeat()
            await asyncio.sleep(every)
            held = self.held.get(policy)
            renewed = await self.ledger.renew(held, self.ttl_s) if held else None
            if renewed is None:
                return  # lost: the fenced publish will be refused
            self.held[policy] = renewed
