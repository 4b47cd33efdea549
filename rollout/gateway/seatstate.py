"""What the gateway keeps in memory per seat, bounded: no seat can grow it, or take every engine slot.

Contract:
- `SeatStates` keeps, for at most `limit` seats (the most recently used), a seat's open segments (its heads)
  and the lock that orders loading and advancing them. An entry a turn holds or waits on is never evicted
  (the limit may then be passed for a moment); `drop` forgets a seat (a closed one) unless a turn still uses
  it. A seat forgotten either way has its heads rebuilt from its stream on its next turn.
- `TurnsInFlight` counts each seat's turns being sampled. `enter` past the limit raises `SeatBusy` (the
  gateway answers 429 with Retry-After) and otherwise gives a `Release`, which ends the count once, however
  often it is called; a seat with no turn in flight has no entry.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from rollout.gateway.segments import Head

MAX_SEATS_KEPT = 4096
MAX_TURNS_IN_FLIGHT_PER_SEAT = 8  # services.gateway.max_turns_in_flight_per_seat


@dataclass
class SeatState:
    heads: list[Head] | None = None  # None: not loaded from the seat's stream yet
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # turns holding or waiting on `lock`


class SeatStates:
    def __init__(self, limit: int = MAX_SEATS_KEPT) -> None:
        self.limit = limit
        self._states: OrderedDict[str, SeatState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, seat_id: str) -> bool:
        return seat_id in self._states

    @asynccontextmanager
    async def use(self, seat_id: str) -> AsyncIterator[SeatState]:
        """The seat's state, under its lock."""
        state = self._states.get(seat_id)
        if state is None:
            state = self._states[seat_id] = SeatState()
        self._states.move_to_end(seat_id)
        state.users += 1
        try:
            async with state.lock:
                yield state
        finally:
            state.users -= 1
            self._evict()

    def drop(self, seat_id: str) -> None:
        state = self._states.get(seat_id)
        if state is not None and state.users == 0:
            del self._states[seat_id]

    def _evict(self) -> None:
        if len(self._states) <= self.limit:
            return
        idle = [seat for seat, state in self._states.items() if state.users == 0]  # oldest first
        for seat in idle[: len(self._states) - self.limit]:
            del self._states[seat]


class SeatBusy(Exception):
    """The seat has as many turns in flight as it may; retry once one has finished."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Release:
    def __init__(self, counts: dict[str, int], seat_id: str) -> None:
        self._counts, self._seat_id, self._done = counts, seat_id, False

    def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        left = self._counts[self._seat_id] - 1
        if left:
            self._counts[self._seat_id] = left
        else:
            del self._counts[self._seat_id]


class TurnsInFlight:
    def __init__(self, limit: int = MAX_TURNS_IN_FLIGHT_PER_SEAT) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def of(self, seat_id: str) -> int:
        return self._counts.get(seat_id, 0)

    def full(self, seat_id: str) -> bool:
        return self.of(seat_id) >= self.limit

    def enter(self, seat_id: str) -> Release:
        if self.full(seat_id):
            raise SeatBusy(
                f"seat {seat_id} already has {self.limit} turns in flight, its limit: retry once one has "
                "finished (Retry-After says when)"
            )
        self._counts[seat_id] = self.of(seat_id) + 1
        return Release(self._counts, seat_id)
