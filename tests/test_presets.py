"""Presets stored in the ledger, versioned, through a cluster context: `rollout cluster connect`, `rollout
status --cluster`, `rollout preset load DIR --cluster`, `rollout preset list --cluster`, against a real
Postgres and Temporal standing in for the cluster's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rollout.config import Settings, load
from rollout.config.presets import UnknownPreset, newest, store, stored, write_presets
from rollout.ledger import Ledger
from rollout.records.presets import PresetVersion

ROOT = Path(__file__).resolve().parent.parent
CHART_PRESETS = ROOT / "charts" / "rollout" / "files" / "presets"


def rollout(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROLLOUT_CONFIG_HOME": str(home)}
    return subprocess.run(["rollout", *args], capture_output=True, text=True, timeout=120, env=env)


def test_the_charts_presets_are_the_packaged_ones() -> None:
    for path in CHART_PRESETS.glob("*.yaml"):
        assert path.read_text() == (ROOT / "rollout" / "conf" / "preset" / path.name).read_text(), path.name


async def test_a_preset_is_stored_once_per_content_and_composes_from_the_ledger(
    ledger: Ledger, tmp_path: Path
) -> None:
    name = f"p-{tmp_path.name[-6:]}"
    first, new = await store(ledger, name, "trainer:\n  steps: 7\n")
    again, new_again = await store(ledger, name, "trainer:\n  steps: 7\n")
    second, _ = await store(ledger, name, "trainer:\n  steps: 9\n")
    assert (first.version, new, again.version, new_again, second.version) == (1, True, 1, False, 2)
    assert (await newest(ledger, name)).version == 2 and (await newest(ledger, name, 1)).text.endswith("7\n")
    with pytest.raises(UnknownPreset, match="no version 5"):
        await newest(ledger, name, 5)
    folder = write_presets([p for p in await stored(ledger) if p.name == name][-1:], tmp_path / "presets")
    settings = load([f"preset={name}", "trainer.lora_rank=4"], preset_dirs=[folder])
    assert (settings.trainer.steps, settings.trainer.lora_rank) == (9, 4), (
        "the newest version, under overrides"
    )


def test_preset_load_with_a_cluster_context_stores_versions_and_refuses_a_bad_preset(
    stack_settings: Settings, tmp_path: Path
) -> None:
    home = tmp_path / "config"
    connected = rollout(
        "cluster",
        "connect",
        "test",
        "--postgres-url",
        stack_settings.ledger_url,
        "--temporal",
        stack_settings.temporal_address,
        "--blobs-url",
        (tmp_path / "blobs").as_uri(),
        home=home,
    )
    assert connected.returncode == 0, connected.stderr
    assert oct((home / "clusters" / "test.json").stat().st_mode)[-3:] == "600"
    (tmp_path / "blobs").mkdir()
    status = rollout("status", "--cluster", "--json", home=home)
    assert status.returncode == 0, status.stdout + status.stderr
    probed = {service["name"]: service["healthy"] for service in json.loads(status.stdout)["services"]}
    assert probed == {"postgres": True, "temporal": True, "blobs": True}, (
        "the cluster's services, probed from here"
    )
    presets = tmp_path / "presets"
    shutil.copytree(CHART_PRESETS, presets)
    name = f"mine-{tmp_path.name[-6:]}"
    (presets / f"{name}.yaml").write_text("# @package _global_\ntrainer:\n  steps: 3\n")
    loaded = rollout("preset", "load", str(presets), "--cluster", "--json", home=home)
    assert loaded.returncode == 0, loaded.stderr
    assert {row["preset"] for row in json.loads(loaded.stdout)} >= {"minecraft-one-gpu@1", f"{name}@1"}
    (presets / f"{name}.yaml").write_text("# @package _global_\ntrainer:\n  steps: 4\n")
    reloaded = rollout("preset", "load", str(presets), "--cluster", "--json", home=home)
    rows = {row["preset"]: row["stored"] for row in json.loads(reloaded.stdout)}
    assert rows[f"{name}@2"] is True and rows["minecraft-one-gpu@1"] is False
    listed = rollout("preset", "list", "--cluster", "--json", home=home)
    assert {f"{name}@1", f"{name}@2"} <= {row["preset"] for row in json.loads(listed.stdout)}

    (presets / "broken.yaml").write_text("trainer:\n  stepz: 3\n")
    refused = rollout("preset", "load", str(presets), "--cluster", home=home)
    assert refused.returncode == 2 and "broken" in refused.stderr and "stepz" in refused.stderr
    assert "Traceback" not in refused.stderr
    (presets / "broken.yaml").unlink()
    (presets / "cpu-micro.yaml").write_text("trainer:\n  stepz: 3\n")  # the file is checked, not the built-in
    shadowing = rollout("preset", "load", str(presets), "--cluster", home=home)
    assert shadowing.returncode == 2 and "cpu-micro" in shadowing.stderr and "stepz" in shadowing.stderr


def test_cluster_without_a_context_says_how_to_make_one(tmp_path: Path) -> None:
    listed = rollout("preset", "list", "--cluster", home=tmp_path / "empty")
    assert listed.returncode == 1 and "rollout cluster connect" in listed.stderr


def test_presets_mounted_on_the_preset_path_compose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment's presets (the chart mounts its ConfigMap) are found through $ROLLOUT_PRESET_PATH."""
    write_presets([PresetVersion("mounted-here", 1, "", "trainer:\n  steps: 7\n")], tmp_path)
    monkeypatch.setenv("ROLLOUT_PRESET_PATH", f"{tmp_path / 'missing'}:{tmp_path}")
    assert load(["preset=mounted-here"]).trainer.steps == 7


def test_a_cluster_context_is_read_from_the_values_a_release_was_installed_with(tmp_path: Path) -> None:
    home = tmp_path / "config"
    values = ROOT / "charts" / "rollout" / "values-multinode.yaml"
    connected = rollout("cluster", "connect", "prod", "--values", str(values), home=home)
    assert connected.returncode == 0, connected.stderr
    shown = json.loads(rollout("cluster", "show", "--json", home=home).stdout)
    assert shown["postgres_url"] == "postgresql://rollout@postgres.data.svc:5432/rollout"
    assert shown["temporal_address"] == "temporal-frontend.temporal.svc:7233"
    assert (shown["blobs_url"], shown["s3_endpoint"], shown["s3_secure"]) == (
        "s3://rollout-prod/",
        "s3.us-east-1.amazonaws.com",
        True,
    )
    # The dev services live inside the release: their addresses must be given.
    dev = rollout(
        "cluster",
        "connect",
        "dev",
        "--values",
        str(ROOT / "charts" / "rollout" / "values-k3s.yaml"),
        home=home,
    )
    assert dev.returncode == 2 and "--postgres-url" in dev.stderr and "Traceback" not in dev.stderr
