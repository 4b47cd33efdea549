"""The records of a run's own stream (`run/{run}`): `RunCreated` (its environment and its settings as it
started) and `SettingsChanged` (what one update changed). Pure data: the settings inside are
rollout.run.settings' flat recorded form, which `RunSettings.from_recorded` checks where it is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout.records import Payload
from rollout.run.settings import Recorded


@dataclass(frozen=True)
class RunCreated(Payload):
    run: str
    environment: str
    settings: Recorded  # `RunSettings.recorded()`


@dataclass(frozen=True)
class SettingsChanged(Payload):
    run: str
    changes: Recorded  # `RunSettingsChange.recorded()`, its text scrubbed of secrets
