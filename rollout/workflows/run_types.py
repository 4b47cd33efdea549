"""The records of `RunWorkflow` (rollout.workflows.run): a run's start (`RunInput`, which the runner's
`create_run` activity records), a change of its settings (`SettingsChange`, which `change_settings` records)
and the signals it takes (`TrainingAdvanced`, `PauseAsked`, `GateTripped`). Its state (`RunStatus`) and the
changes its updates make (`RunChange`) are the run's settings' own (rollout.run.settings): every face reads
and sends them without reaching into the workflows.

A workflow's records live in a module of their own beside it, all in one place, not in the workflow's
module: the activity stubs carry most of them, the workflow's module imports the stubs, and a stubs module
cannot import the workflow that calls it.

Contract: small values only (ids, names, numbers), never transcripts or tensors; each round-trips through
Temporal's default (JSON) data converter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.config import defaults
from rollout.run.launches import RunLaunch
from rollout.run.settings import RunSettings, RunSettingsChange, failure_bound_of
from rollout.workflows.tracking_types import TrackingInput
from rollout.workflows.training_types import TrainingSpec


@dataclass
class RunInput:
    run: str
    environment: str
    groups_in_flight: int = defaults.GROUPS_IN_FLIGHT
    max_groups: int | None = None
    # Its settings as it starts (max_lag, the caps on tokens and temperature, each policy's model, …): the run
    # adds the policies an external model answers, the runner how its commands are confined, and records them.
    settings: RunSettings = field(default_factory=RunSettings)
    training: TrainingSpec | None = None
    # It pauses itself, with the reason, when more than this share of its last `failure_window` episodes
    # failed.
    max_failure_rate: float = defaults.MAX_FAILURE_RATE
    failure_window: int = defaults.FAILURE_WINDOW
    launch: RunLaunch | None = None  # how `rollout train` launched it, recorded as an event of its own
    # A group running this long, or 4× the run's median group time if longer, stops counting against
    # groups_in_flight (rollout.workflows.episodes: a straggler).
    straggler_floor_s: float = defaults.STRAGGLER_FLOOR_S
    # Where its metrics go beside the ledger (rollout.workflows.tracking): the run fills in its trained
    # policies and starts the feed once it knows them.
    tracking: TrackingInput | None = None

    def __post_init__(self) -> None:
        failure_bound_of(self.max_failure_rate, self.failure_window)


@dataclass
class SettingsChange:
    run: str
    key: str  # the business key of this change (its update id)
    changes: RunSettingsChange


@dataclass(frozen=True)
class TrainingAdvanced:
    """`TrainingWorkflow` → `RunWorkflow`: `policy` has finished `steps` steps (trained, or skipped), and
    refill has replaced `replaced` tied groups of it."""

    policy: str
    steps: int
    replaced: int = 0


@dataclass(frozen=True)
class PauseAsked:
    """To `RunWorkflow`: pause the run until it is resumed, for `reason` (a step that could not be published;
    too many failing episodes)."""

    reason: str


@dataclass(frozen=True)
class GateTripped:
    """An eval's gate → `RunWorkflow`: pause the run, once per `gate` (suite@version/checkpoint)."""

    gate: str
    reason: str
