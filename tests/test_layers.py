"""The layers hold: the launcher layer on top, the core at the bottom importing none of the layers above it
(the contracts are `[tool.importlinter]` in pyproject.toml), and every module of `rollout` is placed in one."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_module_of_rollout_is_in_a_layer() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    placed: set[str] = set()
    for contract in config["contracts"]:
        for layer in contract.get("layers", []):
            placed.update(name.strip() for name in layer.split("|"))
        if contract["type"] == "forbidden" and "temporalio" in contract["forbidden_modules"]:
            placed.update(contract["source_modules"])
    top_level = {
        f"rollout.{path.stem if path.is_file() else path.name}"
        for path in (ROOT / "rollout").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    assert top_level - {"rollout.conf"} <= placed, f"not in any layer: {sorted(top_level - placed)}"
