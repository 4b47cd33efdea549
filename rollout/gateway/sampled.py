"""A turn sampled but not yet recorded: what `Gateway.sample` hands back and a live turn settles into.

Contract: `Sampled` carries the request, the seat, the turn the client is sent, the `RecordedTurn` that
recording it appends, and the segment head it extends (None for an external model's turn, which has no token
ids). It is a value; recording it is the gateway's.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout.gateway.requests import ChatRequest, Turn
from rollout.gateway.seats import Seat
from rollout.gateway.segments import Head
from rollout.ledger.payloads import RecordedTurn


@dataclass(frozen=True)
class Sampled:
    """A turn sampled but not yet recorded (the streaming path records it at the end of the stream)."""

    request: ChatRequest
    seat: Seat
    turn: Turn
    record: RecordedTurn  # what `record` appends as the turn's `TurnRecorded`
    head: Head | None  # None for an external model's turn: it has no token ids to extend
