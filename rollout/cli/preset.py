"""`rollout preset load DIR` and `rollout preset list`: presets stored in the ledger, versioned
(rollout.config.presets)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from rollout.cli.cluster import ClusterFlag, cluster_overrides
from rollout.cli.common import JsonFlag, Overrides, err, fail, load_settings, out

app = typer.Typer(help="Presets stored in the ledger (a cluster's runs compose them).", no_args_is_help=True)


@app.command("load")
def load_presets(
    directory: Annotated[
        Path, typer.Argument(help="A folder of NAME.yaml presets (e.g. charts/rollout/files/presets).")
    ],
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Store each NAME.yaml of DIRECTORY as preset NAME in the ledger: new content becomes its next version,
    the same content stores nothing. Each must compose onto the defaults (`rollout config show
    preset=NAME`)."""
    from rollout.config import ConfigError, load
    from rollout.config.presets import BadPreset, check_preset, store, write_presets
    from rollout.control.connections import ledger_session
    from rollout.records.presets import PresetVersion

    files = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    if not files:
        fail(f"no NAME.yaml presets in {directory}", code=2)
    texts = {path.stem: path.read_text() for path in files}
    with tempfile.TemporaryDirectory() as scratch:
        for name, text in texts.items():
            try:
                check_preset(name, text)
            except BadPreset as error:
                fail(str(error), code=2)
            # Under a name of its own: a file named like a built-in preset is checked, not the built-in.
            checked = f"checked-{name}"
            write_presets([PresetVersion(checked, 0, "", text)], Path(scratch))
            try:
                load([f"preset={checked}"], preset_dirs=[Path(scratch)])
            except ConfigError as error:
                fail(f"preset {name} ({directory / (name + '.yaml')}) does not compose: {error}", code=2)
    settings = load_settings(cluster_overrides(cluster, overrides))

    async def store_all() -> list[tuple[PresetVersion, bool]]:
        async with ledger_session(settings) as ledger:
            return [await store(ledger, name, text) for name, text in texts.items()]

    results = asyncio.run(store_all())
    if as_json:
        print(json.dumps([{"preset": p.ref, "stored": new, "sha256": p.sha256} for p, new in results]))
        return
    for preset, new in results:
        out.print(f"{preset.ref:<32} {'stored' if new else 'unchanged'}", highlight=False)
    err.print(f"{sum(new for _, new in results)} of {len(results)} presets stored as new versions")


@app.command("list")
def list_presets(
    overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False
) -> None:
    """Every stored preset version, oldest first."""
    from rollout.config.presets import stored
    from rollout.control.connections import ledger_session
    from rollout.records.presets import PresetVersion

    settings = load_settings(cluster_overrides(cluster, overrides))

    async def read() -> list[PresetVersion]:
        async with ledger_session(settings) as ledger:
            return await stored(ledger)

    presets = asyncio.run(read())
    if as_json:
        print(json.dumps([{"preset": p.ref, "sha256": p.sha256} for p in presets]))
        return
    for preset in presets:
        out.print(f"{preset.ref:<32} {preset.sha256[:12]}", highlight=False)
