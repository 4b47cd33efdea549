"""Ledger values: events to append, events as recorded, fences, leases. Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    """The event kinds the platform writes (rollout.ledger.records: each one's record). Streams may carry
    other kinds; these are the known ones."""

    RUN_CREATED = "RunCreated"
    RUN_LAUNCHED = (
        "RunLaunched"  # how a training run was launched (rollout.run.launches), beside its RunCreated
    )
    SETTINGS_CHANGED = "SettingsChanged"
    TURN_RECORDED = "TurnRecorded"
    EPISODE_FINISHED = "EpisodeFinished"
    EPISODE_ABANDONED = "EpisodeAbandoned"
    BATCH_ASSEMBLED = "BatchAssembled"
    CHECKPOINT_CREATED = "CheckpointCreated"
    CHECKPOINT_CONVERTED = "CheckpointConverted"
    SERVING_TARGET = "ServingTarget"
    SERVING_ACK = "ServingAck"
    EVAL_RESULT = "EvalResult"
    EVAL_GATE_DECIDED = "EvalGateDecided"
    EVAL_SUITE_REGISTERED = "EvalSuiteRegistered"
    SERVING_REQUESTED = "ServingRequested"
    SERVING_RELEASED = "ServingReleased"
    SEAT_OPENED = "SeatOpened"
    SEAT_CLOSED = "SeatClosed"
    SANDBOX_REGISTERED = "SandboxRegistered"
    PRESET_STORED = "PresetStored"


@dataclass(frozen=True)
class NewEvent:
    """An event to append. `key` is the business key that makes the append idempotent (never a Temporal
    id)."""

    key: str
    kind: str
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class Fence:
    """The lease a writer holds: its appends are accepted only while `epoch` is the lease's current epoch and
    `secret` is the one the lease was granted for (it never leaves the holder's process but to the ledger)."""

    resource: str
    epoch: int
    secret: str = field(default="", repr=False, compare=False)


@dataclass(frozen=True)
class Lease:
    """A granted lease. `fence` is what the holder passes to every append it makes under the lease; `secret`
    (never shown, never compared) is what renewing, releasing or taking it again while live must present: the
    ledger keeps only its hash. A lease read back from the ledger (`queries.find_lease`) has none."""

    resource: str
    holder: str
    epoch: int
    expires_at: datetime
    secret: str = field(default="", repr=False, compare=False)

    @property
    def fence(self) -> Fence:
        return Fence(self.resource, self.epoch, self.secret)


@dataclass(frozen=True)
class RecordedEvent:
    """An event as the ledger holds it. `appended` is False when this append found it already there."""

    stream: str
    seq: int
    key: str
    kind: str
    payload: Mapping[str, Any]
    recorded_at: datetime
    appended: bool = True
