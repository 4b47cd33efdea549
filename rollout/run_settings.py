"""A run's live settings as one typed record, checked once wherever a value enters.

Contract:
- `max_lag_of(value, setting)` is the one check of a max_lag: a whole number of checkpoints, 0 (on-policy) or
  more. The config's `run.max_lag`, `rollout run start --max-lag`, `rollout run set`, the operator route, the
  run workflow's update and its input all call it, so a bad value fails where it was given, in one line naming
  `setting`, rather than leaving every turn unadmitted.
- `RunSettings` is what the gateway's admission reads of a run: max_lag, paused, stopped, the run's caps on
  sampled tokens and temperature, the policies an external model answers, and the base model of each policy
  on one of its own.
  `RunSettings.from_recorded(settings)` reads the run projection's settings (a payload from the ledger, so
  checked like any input); a value that fails a check raises `BadRunSetting`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout import defaults

__all__ = ["BadRunSetting", "RunSettings", "max_lag_of"]


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


@dataclass(frozen=True)
class RunSettings:
    max_lag: int = defaults.MAX_LAG
    paused: bool = False
    stopped: bool = False  # a stopped run admits no more turns, paused or not
    max_tokens: int | None = None  # the run's cap on sampled tokens per turn (its `max_tokens` setting)
    temperature: float | None = None  # the run's sampling temperature, over the request's (an eval's setting)
    # Policies an external model answers (`external_model/POLICY` settings): policy -> MODEL[@API_BASE].
    external_models: dict[str, str] = field(default_factory=dict[str, str])
    # The base model each policy samples (`policy_model/POLICY` settings): policy -> model spec. Empty: every
    # policy samples the stack's one model.
    policy_models: dict[str, str] = field(default_factory=dict[str, str])

    def __post_init__(self) -> None:
        max_lag_of(self.max_lag)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise BadRunSetting(f"bad value for 'max_tokens': {self.max_tokens!r}; it takes 1 or more")
        if self.temperature is not None and not self.temperature >= 0:
            raise BadRunSetting(f"bad value for 'temperature': {self.temperature!r}; it takes 0 or more")

    @classmethod
    def from_recorded(cls, settings: Mapping[str, Any]) -> RunSettings:
        """The settings a run recorded (its projection in the ledger); absent ones are the defaults."""
        cap, temperature = settings.get("max_tokens"), settings.get("temperature")
        try:
            return cls(
                max_lag=max_lag_of(settings.get("max_lag", defaults.MAX_LAG)),
                paused=bool(settings.get("paused", False)),
                stopped=bool(settings.get("stopped", False)),
                max_tokens=int(cap) if cap else None,
                temperature=None if temperature is None else float(temperature),
                external_models=_prefixed(settings, defaults.EXTERNAL_MODEL_SETTING),
                policy_models=_prefixed(settings, defaults.POLICY_MODEL_SETTING),
            )
        except (TypeError, ValueError) as error:
            if isinstance(error, BadRunSetting):
                raise
            raise BadRunSetting(f"a run's recorded settings do not parse: {error}") from error


def _prefixed(settings: Mapping[str, Any], prefix: str) -> dict[str, str]:
    """The settings named `PREFIX + POLICY`, by policy."""
    return {
        name.removeprefix(prefix): str(value) for name, value in settings.items() if name.startswith(prefix)
    }
