"""Every event kind the platform writes is read back through one table, as its record
(rollout.ledger.records): a payload that is not its record is refused, and a reader passes over it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from rollout.ledger.events import Kind, RecordedEvent
from rollout.ledger.payloads import AttemptAbandoned, EpisodeEnded, ExternalTurn, SampledTurn
from rollout.ledger.records import KIND_RECORDS, MARKED, record_of, records_of
from rollout.records.checkpoints import CheckpointConverted, CheckpointFile, CheckpointRecord
from rollout.records.seats import SeatOpened


def event(kind: str, payload: dict[str, Any], seq: int = 1) -> RecordedEvent:
    return RecordedEvent(
        stream="test/records",
        seq=seq,
        key=f"k{seq}",
        kind=kind,
        payload=payload,
        recorded_at=datetime.now(UTC),
    )


def test_every_kind_has_its_record_in_the_one_table() -> None:
    assert set(Kind) == set(KIND_RECORDS)
    assert MARKED[Kind.TURN_RECORDED][1] is ExternalTurn and KIND_RECORDS[Kind.TURN_RECORDED] is SampledTurn
    assert MARKED[Kind.EPISODE_ABANDONED][1] is AttemptAbandoned
    assert KIND_RECORDS[Kind.EPISODE_ABANDONED] is EpisodeEnded


def test_an_event_reads_as_its_kinds_record_and_a_forged_one_is_refused_and_passed_over() -> None:
    files = {"adapter.safetensors": CheckpointFile("checkpoints/p/p-step000001/a", "file:///a", "0" * 64, 3)}
    created = CheckpointRecord("p-step000001", "p", 1, None, "run-1", files, {"loss": 0.5})
    bridged = CheckpointConverted("p-step000001", 1, "lora", files)
    opened = SeatOpened("seat-1", "f" * 64, "run-1", "e-1", "solver", "p", None)
    good = [
        event(Kind.CHECKPOINT_CREATED, created.to_payload(), 1),
        event(Kind.CHECKPOINT_CONVERTED, bridged.to_payload(), 2),
        event(Kind.SEAT_OPENED, opened.to_payload(), 3),
    ]
    assert [record_of(e) for e in good] == [created, bridged, opened]
    forged = [
        event(Kind.CHECKPOINT_CREATED, {"name": "../../etc", "policy": "p", "version": 1}, 4),
        event(Kind.CHECKPOINT_CREATED, created.to_payload() | {"name": "../escape"}, 5),
        event(Kind.SEAT_OPENED, {"seat": "seat-2"}, 6),
        event("RewardAssigned", {"reward": 1.0}, 7),  # a kind no writer of ours appends
    ]
    for each in forged:
        with pytest.raises(ValueError, match=r"not a \w+ payload|no record is written"):
            record_of(each)
    mixed = [forged[0], good[0], forged[1], good[2], forged[3]]
    assert records_of(mixed, CheckpointRecord) == [created]
    assert records_of(mixed, SeatOpened) == [opened]
