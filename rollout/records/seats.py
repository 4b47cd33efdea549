"""The records of a seat in the ledger (on `seat/{seat}`): `SeatOpened` (who it is for, and the hash of its
token, never the token) and `SeatClosed` (why). Pure data: rollout.gateway.seats opens and closes seats.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout.records import Payload


@dataclass(frozen=True)
class SeatOpened(Payload):
    seat: str
    token_sha256: str
    run: str | None
    episode: str | None
    agent: str
    policy: str
    checkpoint: str | None  # the checkpoint it is pinned to (a fixed or self-play pin), None to follow


@dataclass(frozen=True)
class SeatClosed(Payload):
    seat: str
    reason: str
