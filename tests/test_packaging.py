"""Honest packages: `rollout` is one distribution, and every library its modules import is declared in its
dependencies or one of its extras (so a user who installs it, or an extra, gets what the code needs)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported_top_levels() -> dict[str, str]:
    """Top-level module → a file importing it, over every module of `rollout` (stdlib and rollout left
    out)."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "rollout").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top != "rollout" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_library_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for extra in project.get("optional-dependencies", {}).values():
        declared |= {_name(r) for r in extra}
    distributions = importlib.metadata.packages_distributions()
    missing = {
        f"{top} (imported by {where}; distribution {', '.join(distributions.get(top, ['?']))})"
        for top, where in _imported_top_levels().items()
        if not {d.lower().replace("_", "-") for d in distributions.get(top, [])} & declared
    }
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
