"""A run's settings as one typed record, from the command line to the ledger and back, checked once wherever
a value enters.

Contract:
- `max_lag_of(value, setting)` is the one check of a max_lag: a whole number of checkpoints, 0 (on-policy) or
  more. The config's `run.max_lag`, `rollout run start --max-lag`, `rollout run set`, the operator route, the
  run workflow's update and its input all call it, so a bad value fails where it was given, in one line naming
  `setting`, rather than leaving every turn unadmitted. `failure_bound_of` is the same for the run's bound on
  failing episodes.
- `RunSettings` is every setting a run records: what its start gives (`RunInput.settings`), what the runner's
  `create_run` adds (how its agents' commands are confined), what the gateway's admission reads (max_lag,
  paused, stopped, the caps on sampled tokens and temperature, the policies an external model answers, each
  policy's base model), and what the dashboard and `rollout run status` show. `recorded()` is its form in the
  ledger (`RunCreated`'s settings and the `run` projection: a flat object whose keys never change, since
  recorded data depends on them); `from_recorded(settings)` reads that form back and checks it like any input
  (it comes from the ledger): a value that fails raises `BadRunSetting`.
- `RunSettingsChange` is what one update of a running run changes (pause, resume, stop, max_lag);
  `recorded()` is its `SettingsChanged` payload, which the projection merges over the settings, and
  `RunSettings.changed(change)` is the same merge on the record.
- `RunStatus` is a run's state as its workflow reports it (its `status` query and its result), and `RunChange`
  (`PauseRun`, `ResumeRun`, `StopRun`, `MaxLagChange`) what one update changes: the records every face (the
  CLI, the dashboard, the gateway's operator routes) reads and sends through rollout.control.runs.
- Nothing outside this module reads or writes a run setting by its recorded name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rollout.config import defaults

__all__ = [
    "BadRunSetting",
    "MaxLagChange",
    "PauseRun",
    "ResumeRun",
    "RunChange",
    "RunSettings",
    "RunSettingsChange",
    "RunStatus",
    "StopRun",
    "failure_bound_of",
    "max_lag_of",
]


class BadRunSetting(ValueError):
    """A run setting's value is wrong; the message names the setting and what it takes."""


def max_lag_of(value: object, setting: str = "max_lag") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRunSetting(
            f"bad value for {setting!r}: {value!r}; it takes a whole number of checkpoints a turn may sample "
            "behind the newest, 0 (on-policy) or more"
        )
    return value


def failure_bound_of(rate: object, window: object, prefix: str = "") -> tuple[float, int]:
    """A run's bound on failing episodes: pause when more than `rate` of the last `window` failed."""
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
        raise BadRunSetting(
            f"bad value for '{prefix}max_failure_rate': {rate!r}; it takes the share of recent episodes that may "
            "fail before the run pauses itself, above 0 and at most 1 (1: never pause)"
        )
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise BadRunSetting(
            f"bad value for '{prefix}failure_window': {window!r}; it takes how many recent episodes the failure "
            "rate is counted over, 1 or more"
        )
    return float(rate), window


# The recorded names of the settings that are not fields of the same name.
_EVAL, _CHECKPOINT, _ISOLATION, _COMMAND_POOL = (
    "eval",
    "checkpoint",
    "sandbox.isolation",
    "sandbox.command_pool",
)
# A run setting per policy answered by an external model: `external_model/POLICY` = `MODEL[@API_BASE]`.
_EXTERNAL_MODEL = "external_model/"
# A run setting per policy on a base model of its own: `policy_model/POLICY` = the model's spec.
_POLICY_MODEL = "policy_model/"

type Recorded = dict[str, bool | int | float | str]


@dataclass(frozen=True)
class RunSettingsChange:
    """What one update of a running run changes; a field left None stays as it was."""

    paused: bool | None = None
    pause_reason: str | None = None  # why the run paused itself; "" once the reason no longer holds
    stopped: bool | None = None
    max_lag: int | None = None

    def __post_init__(self) -> None:
        if self.max_lag is not None:
            max_lag_of(self.max_lag)

    def recorded(self) -> Recorded:
        """The `SettingsChanged` payload's changes."""
        return {name: value for name, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class RunSettings:
    """Every setting a run records. The defaults are those of a run started with none given."""

    max_lag: int = defaults.MAX_LAG
    paused: bool = False
    pause_reason: str | None = None  # why the run paused itself (a failure rate, a non-finite loss, a gate)
    stopped: bool = False  # a stopped run admits no more turns, paused or not
    max_tokens: int | None = None  # the run's cap on sampled tokens per turn (its `max_tokens` setting)
    temperature: float | None = None  # the run's sampling temperature, over the request's (an eval's setting)
    eval_suite: str | None = None  # an eval's run: the suite it plays, `SUITE@VERSION`
    eval_checkpoint: str | None = None  # an eval's run: the checkpoint it scores
    # How the runner that created the run confined its agents' commands (its `sandbox.isolation`), and the
    # pool of command hosts its command seats ran on (`sandbox.command_pool`), if any.
    sandbox_isolation: str | None = None
    command_pool: str | None = None
    # Policies an external model answers: policy -> MODEL[@API_BASE] (the gateway answers their seats).
    external_models: dict[str, str] = field(default_factory=dict[str, str])
    # The base model each policy samples: policy -> model spec (the gateway renders and routes each policy's
    # seats by it). Empty: every policy samples the stack's one model.
    policy_models: dict[str, str] = field(default_factory=dict[str, str])

    def __post_init__(self) -> None:
        max_lag_of(self.max_lag)
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise BadRunSetting(f"bad value for 'max_tokens': {self.max_tokens!r}; it takes 1 or more")
        if self.temperature is not None and not self.temperature >= 0:
            raise BadRunSetting(f"bad value for 'temperature': {self.temperature!r}; it takes 0 or more")

    @property
    def is_eval(self) -> bool:
        return self.eval_suite is not None

    def changed(self, change: RunSettingsChange) -> RunSettings:
        """These settings after `change`, as the `run` projection folds it."""
        return RunSettings.from_recorded({**self.recorded(), **change.recorded()})

    def recorded(self) -> Recorded:
        """The ledger's form: a flat object, each setting by its recorded name (absent when unset)."""
        values = asdict(self)
        named: dict[str, Any] = {
            "max_lag": self.max_lag,
            "paused": self.paused,
            "stopped": self.stopped,
            **{name: values[name] for name in ("pause_reason", "max_tokens", "temperature")},
            _EVAL: self.eval_suite,
            _CHECKPOINT: self.eval_checkpoint,
            _ISOLATION: self.sandbox_isolation,
            _COMMAND_POOL: self.command_pool,
            **{_EXTERNAL_MODEL + policy: model for policy, model in self.external_models.items()},
            **{_POLICY_MODEL + policy: model for policy, model in self.policy_models.items()},
        }
        return {name: value for name, value in named.items() if value is not None}

    @classmethod
    def from_recorded(cls, settings: Mapping[str, Any]) -> RunSettings:
        """The settings a run recorded (its projection in the ledger); absent ones are the defaults."""
        if not isinstance(settings, Mapping):
            raise BadRunSetting(f"a run's recorded settings are not an object: {settings!r}")
        try:
            return cls(
                max_lag=max_lag_of(settings.get("max_lag", defaults.MAX_LAG)),
                paused=_flag(settings, "paused"),
                pause_reason=_text(settings, "pause_reason") or None,
                stopped=_flag(settings, "stopped"),
                max_tokens=_whole(settings, "max_tokens"),
                temperature=_number(settings, "temperature"),
                eval_suite=_text(settings, _EVAL),
                eval_checkpoint=_text(settings, _CHECKPOINT),
                sandbox_isolation=_text(settings, _ISOLATION),
                command_pool=_text(settings, _COMMAND_POOL),
                external_models=_prefixed(settings, _EXTERNAL_MODEL),
                policy_models=_prefixed(settings, _POLICY_MODEL),
            )
        except (TypeError, ValueError) as error:
            if isinstance(error, BadRunSetting):
                raise
            raise BadRunSetting(f"a run's recorded settings do not parse: {error}") from error


def _flag(settings: Mapping[str, Any], name: str) -> bool:
    value = settings.get(name, False)
    if not isinstance(value, bool):
        raise BadRunSetting(f"a run's recorded {name!r} is not true or false: {value!r}")
    return value


def _text(settings: Mapping[str, Any], name: str) -> str | None:
    value = settings.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRunSetting(f"a run's recorded {name!r} is not text: {value!r}")
    return value


def _whole(settings: Mapping[str, Any], name: str) -> int | None:
    value = _number(settings, name)
    if value is not None and not value.is_integer():
        raise BadRunSetting(f"a run's recorded {name!r} is not a whole number: {value!r}")
    return None if value is None else int(value)


def _number(settings: Mapping[str, Any], name: str) -> float | None:
    value = settings.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise BadRunSetting(f"a run's recorded {name!r} is not a number: {value!r}")
    return None if value is None else float(value)


def _prefixed(settings: Mapping[str, Any], prefix: str) -> dict[str, str]:
    """The settings named `PREFIX + POLICY`, by policy."""
    found = {name.removeprefix(prefix): value for name, value in settings.items() if name.startswith(prefix)}
    for policy, value in found.items():
        if not isinstance(value, str):
            raise BadRunSetting(f"a run's recorded {prefix}{policy} is not text: {value!r}")
    return found


@dataclass
class RunStatus:
    """A run's state (`RunWorkflow.status`, and its result). The episode and group counts are the supply's
    (`SupplyCounts`), known once it has ended: 0 while it plays."""

    run: str
    paused: bool
    stopped: bool
    max_lag: int
    episodes_finished: int
    episodes_failed: int
    groups_finished: int
    pause_reason: str | None = None
    trained: dict[str, str | None] = field(
        default_factory=dict[str, str | None]
    )  # policy -> newest checkpoint


@dataclass(frozen=True)
class PauseRun:
    """`RunWorkflow.pause`: no new turn or episode begins until the run is resumed."""

    label = "pause"


@dataclass(frozen=True)
class ResumeRun:
    """`RunWorkflow.resume`: the run plays again, and a training paused with it goes on."""

    label = "resume"


@dataclass(frozen=True)
class StopRun:
    """`RunWorkflow.stop`: the run ends once the episodes in flight finish."""

    label = "stop"


@dataclass(frozen=True)
class MaxLagChange:
    """`RunWorkflow.set_max_lag`: how many checkpoints a turn may sample behind the newest from now on."""

    max_lag: int

    @property
    def label(self) -> str:
        return f"max_lag={self.max_lag}"


type RunChange = PauseRun | ResumeRun | StopRun | MaxLagChange
"""What an update of a run changes (rollout.control.runs.update_run sends it); `label` names it."""
