"""What the faces read from the ledger (the dashboard's views, the CLI's listings): one curated read API, so
no face reaches into the ledger package.

Contract:
- `read_ledger(settings, query, patience_s)` runs one query on a fresh connection as the read-only login
  (`settings.reader_ledger_url`), giving up on a ledger that is down within `patience_s`: it raises
  `LedgerUnreachable` (an `Unreachable`), never hangs a page.
- The queries below take the `Ledger` that `read_ledger` (or `ledger_session`) hands its query, and answer
  typed rows; each checks what it reads from the ledger and passes over a row it cannot parse.
  - Runs: `list_runs`, `count_runs`, `find_run` (`RunRow`); `run_progress`; `failure_counts`
    (`FailureCount`); `run_steps` (`StepRow`: each step's metrics); `episode_rate` and `run_activity`
    (`EpisodeRate`).
  - Episodes and transcripts: `find_episodes` (`EpisodeRow`), `seat_events(ledger, seat)` (a seat's events in
    order), `turn_recorded` (one `TurnRecorded` payload as its `SampledTurn`) and `records_of(events, cls)`
    (the events that read as a record, such as the seat's `SeatOpened`: rollout.ledger.records).
  - Checkpoints, engines and leases: `checkpoint_tree` (`CheckpointNode`), `engines` (`EngineRow`), `leases`
    (`LeaseRow`), with `sandbox_host_lease(resource)` and `sandbox_claim(resource)` naming which leases are
    sandbox hosts' and which their claims.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from rollout.control.errors import Unreachable
from rollout.ledger.payloads import SampledTurn, turn_recorded
from rollout.ledger.queries import (
    FailureCount,
    RunRow,
    count_runs,
    failure_counts,
    find_run,
    list_runs,
    read_all,
    run_progress,
)
from rollout.ledger.records import records_of
from rollout.ledger.streams import sandbox_host_leases_prefix, sandbox_leases_prefix, seat_stream
from rollout.ledger.views import (
    CheckpointNode,
    EngineRow,
    EpisodeRate,
    EpisodeRow,
    LeaseRow,
    StepRow,
    checkpoint_tree,
    engines,
    episode_rate,
    find_episodes,
    leases,
    run_activity,
    run_steps,
)
from rollout.records.seats import SeatOpened

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.ledger import Ledger
    from rollout.ledger.events import RecordedEvent

__all__ = [
    "CheckpointNode",
    "EngineRow",
    "EpisodeRate",
    "EpisodeRow",
    "FailureCount",
    "LeaseRow",
    "LedgerReader",
    "LedgerUnreachable",
    "RunRow",
    "SampledTurn",
    "SeatOpened",
    "StepRow",
    "checkpoint_tree",
    "count_runs",
    "engines",
    "episode_rate",
    "failure_counts",
    "find_episodes",
    "find_run",
    "leases",
    "list_runs",
    "read_ledger",
    "records_of",
    "run_activity",
    "run_progress",
    "run_steps",
    "sandbox_claim",
    "sandbox_host_lease",
    "seat_events",
    "turn_recorded",
]

type LedgerReader = Ledger
"""The handle a query is given: read with the functions above, never by SQL of a face's own."""


class LedgerUnreachable(Unreachable):
    """The ledger did not answer within the read's patience."""


async def read_ledger[T](settings: Settings, query: Callable[[Ledger], Awaitable[T]], patience_s: float) -> T:
    from rollout.ledger import Ledger
    from rollout.ledger.errors import LedgerError

    try:
        async with await Ledger.connect(
            settings.reader_ledger_url, max_size=2, reconnect_window_s=patience_s
        ) as ledger:
            return await query(ledger)
    except LedgerError as error:
        raise LedgerUnreachable(str(error)) from None  # each face says what to do in its own words


async def seat_events(ledger: Ledger, seat: str) -> list[RecordedEvent]:
    return await read_all(ledger, seat_stream(seat))


def sandbox_host_lease(resource: str) -> str | None:
    """The sandbox a host's pool lease is for (None: not a sandbox host's lease)."""
    prefix = sandbox_host_leases_prefix("")
    return resource.removeprefix(prefix) if resource.startswith(prefix) else None


def sandbox_claim(resource: str) -> bool:
    """Whether a lease is a claim of a sandbox."""
    return resource.startswith(sandbox_leases_prefix(""))
