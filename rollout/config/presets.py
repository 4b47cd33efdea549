"""Presets kept in the ledger, versioned: what `rollout preset load DIR` stores, so a cluster's runs compose
them.

Contract:
- A preset is a YAML mapping of settings (`rollout config show` names them), as in rollout/conf/preset/.
  `store` appends `PresetStored` on the stream `presets` under `{name}@{version}` with the text and its
  sha256. Storing the same text as the name's newest version stores nothing and returns that version; other
  text becomes the next version (1, 2, ...). Nothing is overwritten: every version stays readable. Two stores
  racing for one version: one wins it, the other takes the next.
- `stored(ledger)` lists every version in order; `newest(ledger, name, version=None)` finds one or raises
  `UnknownPreset` naming what there is.
- `write_presets(presets, directory)` writes each as `directory/preset/NAME.yaml` (as Hydra's `preset` group
  reads it); `rollout.config.load(overrides, preset_dirs=[directory])` then composes `preset=NAME` from there.
- Names are what a file may be called and Hydra may choose: letters, digits, `-`, `_` and `.`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from rollout.ledger.errors import KeyConflictError
from rollout.ledger.events import Kind, NewEvent
from rollout.ledger.queries import read_all
from rollout.ledger.records import records_of
from rollout.ledger.streams import PRESETS
from rollout.records.presets import PresetVersion

if TYPE_CHECKING:
    from rollout.ledger import Ledger

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
HEADER = "# @package _global_\n"


class UnknownPreset(LookupError):
    """No preset (or no such version of it) is stored."""


class BadPreset(ValueError):
    """The text is not a preset; the message says why."""


def check_preset(name: str, text: str) -> None:
    """Refuse a name Hydra cannot choose, or text that is not a YAML mapping."""
    if not NAME.match(name):
        raise BadPreset(f"{name!r} cannot name a preset: use letters, digits, '-', '_' and '.'")
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise BadPreset(f"preset {name}: not YAML ({error})") from None
    if not isinstance(tree, dict):
        raise BadPreset(f"preset {name}: a preset is a mapping of settings, not {type(tree).__name__}")


async def stored(ledger: Ledger) -> list[PresetVersion]:
    return records_of(await read_all(ledger, PRESETS), PresetVersion)


async def store(ledger: Ledger, name: str, text: str) -> tuple[PresetVersion, bool]:
    """Store `text` as preset `name` (see the module contract); True when a new version was stored."""
    check_preset(name, text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    while True:
        versions = [p for p in await stored(ledger) if p.name == name]
        if versions and versions[-1].sha256 == digest:
            return versions[-1], False
        preset = PresetVersion(name, (versions[-1].version if versions else 0) + 1, digest, text)
        try:
            await ledger.append_one(PRESETS, NewEvent(preset.ref, Kind.PRESET_STORED, preset.to_payload()))
        except KeyConflictError:
            continue  # another store took this version: look again
        return preset, True


async def newest(ledger: Ledger, name: str, version: int | None = None) -> PresetVersion:
    everything = await stored(ledger)
    versions = [p for p in everything if p.name == name]
    chosen = [p for p in versions if version is None or p.version == version]
    if chosen:
        return chosen[-1]
    if versions:
        raise UnknownPreset(
            f"preset {name} has no version {version}: stored are {', '.join(p.ref for p in versions)}"
        )
    names = sorted({p.name for p in everything})
    raise UnknownPreset(
        f"no preset {name!r} is stored (stored: {', '.join(names) or 'none'}); store presets with "
        "`rollout preset load DIR`"
    )


def write_presets(presets: list[PresetVersion], directory: Path) -> Path:
    """Write `presets` where Hydra's `preset` group finds them (`directory/preset/NAME.yaml`)."""
    group = directory / "preset"
    group.mkdir(parents=True, exist_ok=True)
    for preset in presets:
        text = preset.text if preset.text.startswith("# @package") else HEADER + preset.text
        (group / f"{preset.name}.yaml").write_text(text)
    return directory
