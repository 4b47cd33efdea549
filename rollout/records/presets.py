"""The record of a preset stored in the ledger (`PresetStored`, on `presets`, keyed `NAME@VERSION`): its
text and the SHA-256 that says whether new text is a new version. Pure data: rollout.config.presets stores and
reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout.records import Payload


@dataclass(frozen=True)
class PresetVersion(Payload):
    name: str
    version: int
    sha256: str
    text: str

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"
