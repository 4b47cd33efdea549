"""Each event kind's record: the one table from kind to record class, and an event read back as its record.

Contract:
- `KIND_RECORDS` gives, for every kind the platform writes, the record its payload is (a `rollout.records`
  `Payload`). Two kinds hold one of two records, told apart by a marker the writer adds (`MARKED`): a
  `TurnRecorded` with `external` is an `ExternalTurn`, else a `SampledTurn`; an `EpisodeAbandoned` with
  `attempt` is an `AttemptAbandoned` (one agent's attempt), else an `EpisodeEnded` (the whole episode).
- `record_of(event)` is the event's payload read as its kind's record, checked as any input (it comes from
  the ledger, where other writers may append): a payload that is not that record, or a kind with no record
  (one the platform never writes), raises `ValueError`. No reader parses a payload by hand.
- `records_of(events, cls)` is every event that reads as a `cls`, in order, passing over the rest: a forged
  payload costs only itself, never the reason the others go unread.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollout.ledger.events import Kind, RecordedEvent
from rollout.ledger.payloads import AttemptAbandoned, EpisodeEnded, ExternalTurn, SampledTurn
from rollout.records import Payload
from rollout.records.batches import BatchInfo
from rollout.records.checkpoints import CheckpointConverted, CheckpointRecord
from rollout.records.evals import EvalResult, GateDecision, SuiteRegistered
from rollout.records.presets import PresetVersion
from rollout.records.runs import RunCreated, SettingsChanged
from rollout.records.sandboxes import SandboxRegistered
from rollout.records.seats import SeatClosed, SeatOpened
from rollout.records.serving import ServingAck, ServingRequest, ServingTarget
from rollout.run.launches import RunLaunch

KIND_RECORDS: dict[Kind, type[Payload]] = {
    Kind.RUN_CREATED: RunCreated,
    Kind.RUN_LAUNCHED: RunLaunch,
    Kind.SETTINGS_CHANGED: SettingsChanged,
    Kind.TURN_RECORDED: SampledTurn,
    Kind.EPISODE_FINISHED: EpisodeEnded,
    Kind.EPISODE_ABANDONED: EpisodeEnded,
    Kind.BATCH_ASSEMBLED: BatchInfo,
    Kind.CHECKPOINT_CREATED: CheckpointRecord,
    Kind.CHECKPOINT_CONVERTED: CheckpointConverted,
    Kind.SERVING_TARGET: ServingTarget,
    Kind.SERVING_ACK: ServingAck,
    Kind.SERVING_REQUESTED: ServingRequest,
    Kind.SERVING_RELEASED: ServingRequest,
    Kind.EVAL_RESULT: EvalResult,
    Kind.EVAL_GATE_DECIDED: GateDecision,
    Kind.SEAT_OPENED: SeatOpened,
    Kind.SEAT_CLOSED: SeatClosed,
    Kind.EVAL_SUITE_REGISTERED: SuiteRegistered,
    Kind.SANDBOX_REGISTERED: SandboxRegistered,
    Kind.PRESET_STORED: PresetVersion,
}
"""The record of each kind's payload (where `MARKED` names no other for it)."""

MARKED: dict[Kind, tuple[str, type[Payload]]] = {
    Kind.TURN_RECORDED: ("external", ExternalTurn),
    Kind.EPISODE_ABANDONED: ("attempt", AttemptAbandoned),
}
"""The kinds whose payload is another record when it carries a marker: (the marker, that record)."""


def record_of(event: RecordedEvent) -> Payload:
    marked = MARKED.get(Kind(event.kind)) if event.kind in Kind else None
    if marked is not None and event.payload.get(marked[0]):
        return marked[1].from_payload(event.payload)
    try:
        record = KIND_RECORDS[Kind(event.kind)]
    except (KeyError, ValueError):
        raise ValueError(f"no record is written as a {event.kind!r} event") from None
    return record.from_payload(event.payload)


def records_of[R: Payload](events: Iterable[RecordedEvent], cls: type[R]) -> list[R]:
    found: list[R] = []
    for event in events:
        try:
            record = record_of(event)
        except (TypeError, ValueError):
            continue
        if isinstance(record, cls):
            found.append(record)
    return found
