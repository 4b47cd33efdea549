"""The ledger: an append-only, fenced event log in Postgres. See rollout.ledger.store for the contract."""

from rollout.ledger.errors import (
    AppendOnlyError,
    KeyConflictError,
    LedgerError,
    LedgerUnreachableError,
    StaleFenceError,
)
from rollout.ledger.events import Fence, Kind, Lease, NewEvent, RecordedEvent
from rollout.ledger.store import Ledger

__all__ = [
    "AppendOnlyError",
    "Fence",
    "KeyConflictError",
    "Kind",
    "Lease",
    "Ledger",
    "LedgerError",
    "LedgerUnreachableError",
    "NewEvent",
    "RecordedEvent",
    "StaleFenceError",
]
