"""Admission: which engine may serve a turn, given the run's settings in the ledger.

Contract:
- A turn for a seat on policy P may begin only on an engine serving a checkpoint of version
  `v >= newest(P) - max_lag`, where `max_lag` and `paused` are the run's current settings (the `run` projection)
  and `newest(P)` is P's newest checkpoint version. Settings are re-read for every turn (a mid-run change takes
  effect on the next turn); nothing here talks to Temporal.
- A seat pinned to a checkpoint goes only to engines serving that checkpoint; a seat with no run is not limited.
- While the run is paused, or no engine qualifies or answers, the turn waits, up to `wait_s`, then
  `EngineUnavailable` (the gateway's 503 with Retry-After).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

from rollout.engines.protocol import Engine, EngineUnavailable
from rollout.gateway.seats import Seat
from rollout.ledger import Ledger

DEFAULT_MAX_LAG = 1


@dataclass
class EngineSlot:
    """An engine and what it serves now: a checkpoint (the name requests use) and that checkpoint's version."""

    engine: Engine
    checkpoint: str = "base"
    version: int = 0
    policy: str = "default"


@dataclass(frozen=True)
class RunSettings:
    max_lag: int = DEFAULT_MAX_LAG
    paused: bool = False


class Admission:
    def __init__(
        self, ledger: Ledger, slots: list[EngineSlot], *, wait_s: float = 30.0, poll_s: float = 0.2
    ) -> None:
        self.ledger = ledger
        self.slots = slots
        self.wait_s, self.poll_s = wait_s, poll_s
        self._turn = itertools.count()

    async def run_settings(self, run: str | None) -> RunSettings:
        if run is None:
            return RunSettings(max_lag=1 << 30)
        row = await self.ledger.fetch_one("SELECT settings FROM run WHERE run_id = %s", run)
        settings: dict[str, Any] = row["settings"] if row else {}
        return RunSettings(int(settings.get("max_lag", DEFAULT_MAX_LAG)), bool(settings.get("paused", False)))

    async def newest_version(self, policy: str) -> int:
        row = await self.ledger.fetch_one(
            "SELECT max((payload->>'version')::bigint) AS newest FROM event"
            " WHERE stream_id = %s AND kind = 'CheckpointCreated'",
            f"policy/{policy}/checkpoints",
        )
        return int(row["newest"]) if row and row["newest"] is not None else 0

    def eligible(self, seat: Seat, settings: RunSettings, newest: int) -> list[EngineSlot]:
        if seat.checkpoint is not None:
            return [s for s in self.slots if s.checkpoint == seat.checkpoint]
        return [s for s in self.slots if s.policy == seat.policy and s.version >= newest - settings.max_lag]

    async def candidates(self, seat: Seat) -> list[EngineSlot]:
        """Eligible engines in the order to try them (rotating, so load spreads); waits while paused."""
        deadline = time.monotonic() + self.wait_s
        while True:
            settings = await self.run_settings(seat.run)
            reason = "the run is paused"
            if not settings.paused:
                # A seat outside any run (or pinned to a checkpoint) has no staleness bound: skip the lookup.
                unbounded = seat.run is None or seat.checkpoint is not None
                newest = 0 if unbounded else await self.newest_version(seat.policy)
                found = self.eligible(seat, settings, newest)
                if found:
                    start = next(self._turn) % len(found)
                    return found[start:] + found[:start]
                reason = (
                    f"no engine serves a checkpoint within max_lag={settings.max_lag} of version {newest}"
                )
            if time.monotonic() >= deadline:
                raise EngineUnavailable(
                    f"turn not admitted: {reason}", retry_after_s=max(self.poll_s * 5, 1.0)
                )
            await asyncio.sleep(self.poll_s)
