"""Seats: who is sampling. A seat names a run, an episode, an agent and the policy (or pinned checkpoint) it
samples from, and carries a bearer token.

Contract:
- Opening a seat is idempotent by seat id: the token is derived from the seat id with the gateway's secret
  (HMAC), so a retried open returns the same token and appends nothing new.
- The ledger stores only the token's SHA-256; `resolve` looks a token up by that hash. `resolve_for_turn` does
  the same and, in the same query (one round trip on every turn's path), finds the turn already recorded under
  a key on the seat's stream, if any.
- A closed seat resolves (so the gateway can answer 410) but `Seat.open` is False.
- `SeenSeats` remembers which seat a token named, in this process, so a turn can be rendered while its seat is
  looked up. It is never trusted for a check: every turn still resolves its seat (open or closed) from the
  ledger, and a token's seat never changes.
- A seat's turns live on its own stream only: a token reaches exactly the turns recorded under its seat,
  whatever ids or history the client sends (replays and segments are looked up on that stream alone).
- Secrets on disk (the token secret, the operator key: rollout.security.keyfiles) are made once, mode 600.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from rollout.ledger import Kind, Ledger, NewEvent, RecordedEvent
from rollout.ledger.queries import SeatRow, seat_and_turn_by_token_hash, seat_by_token_hash
from rollout.ledger.streams import seat_stream
from rollout.records.seats import SeatClosed, SeatOpened
from rollout.security.keyfiles import secret_file


@dataclass(frozen=True)
class Seat:
    seat_id: str
    agent: str
    policy: str
    run: str | None = None
    episode: str | None = None
    checkpoint: str | None = None
    open: bool = True

    @property
    def stream(self) -> str:
        return seat_stream(self.seat_id)


def load_secret(path: Path) -> bytes:
    """The gateway's token secret, made once and kept in the data directory (mode 600)."""
    return secret_file(path, lambda: secrets.token_bytes(32))


def seat_token(secret: bytes, seat_id: str) -> str:
    return "rs-" + hmac.new(secret, seat_id.encode(), hashlib.sha256).hexdigest()[:40]


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def open_seat(
    ledger: Ledger,
    secret: bytes,
    *,
    seat_id: str,
    agent: str,
    policy: str = "default",
    run: str | None = None,
    episode: str | None = None,
    checkpoint: str | None = None,
) -> tuple[Seat, str]:
    token = seat_token(secret, seat_id)
    seat = Seat(seat_id=seat_id, agent=agent, policy=policy, run=run, episode=episode, checkpoint=checkpoint)
    opened = SeatOpened(seat_id, _sha(token), run, episode, agent, policy, checkpoint)
    await ledger.append_one(seat.stream, NewEvent("opened", Kind.SEAT_OPENED, opened.to_payload()))
    return seat, token


async def close_seat(ledger: Ledger, seat_id: str, reason: str = "finished") -> None:
    closed = SeatClosed(seat_id, reason)
    await ledger.append_one(seat_stream(seat_id), NewEvent("closed", Kind.SEAT_CLOSED, closed.to_payload()))


def _seat(row: SeatRow) -> Seat:
    return Seat(
        seat_id=row.seat,
        agent=row.agent,
        policy=row.policy,
        run=row.run,
        episode=row.episode,
        checkpoint=row.checkpoint,
        open=row.open,
    )


async def resolve(ledger: Ledger, token: str) -> Seat | None:
    row = await seat_by_token_hash(ledger, _sha(token))
    return None if row is None else _seat(row)


async def resolve_for_turn(
    ledger: Ledger, token: str, turn_key: str
) -> tuple[Seat | None, RecordedEvent | None]:
    """The token's seat, and the event recorded under `turn_key` on its stream (None when there is none)."""
    row, recorded = await seat_and_turn_by_token_hash(ledger, _sha(token), turn_key)
    return (None, None) if row is None else (_seat(row), recorded)


class SeenSeats:
    """The seats the last `limit` tokens named (by token hash), newest kept."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._seats: OrderedDict[str, Seat] = OrderedDict()

    def get(self, token: str) -> Seat | None:
        return self._seats.get(_sha(token))

    def remember(self, token: str, seat: Seat) -> None:
        key = _sha(token)
        self._seats[key] = seat
        self._seats.move_to_end(key)
        if len(self._seats) > self.limit:
            self._seats.popitem(last=False)
