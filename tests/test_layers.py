"""The layers hold: the launcher layer on top, the core at the bottom importing none of the layers above it
(the contracts are `[tool.importlinter]` in pyproject.toml), and every module of `rollout` is placed in
one."""

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
    unplaced = []
    for path in (ROOT / "rollout").iterdir():
        if path.suffix == ".py" and path.stem != "__init__":
            placed_here = f"rollout.{path.stem}" in placed
        elif (path / "__init__.py").is_file():  # a package is placed whole, or module by module
            modules = {f"rollout.{path.name}.{module.stem}" for module in path.glob("*.py")} - {
                f"rollout.{path.name}.__init__"
            }
            placed_here = f"rollout.{path.name}" in placed or modules <= placed
        else:
            continue
        if not placed_here:
            unplaced.append(path.name)
    assert unplaced == [], f"not in any layer: {sorted(unplaced)}"


def _graph():  # grimp's graph type is private
    import grimp

    return grimp.build_graph("rollout", include_external_packages=True, cache_dir=None)


def test_no_import_circles() -> None:
    """No module of `rollout` reaches itself through its imports (lazy imports inside functions included)."""
    graph = _graph()
    modules = sorted(m for m in graph.modules if m.startswith("rollout"))
    circles = [
        f"{a} ↔ {b}"
        for a in modules
        for b in graph.find_modules_directly_imported_by(a)
        if b.startswith("rollout") and a < b and graph.chain_exists(importer=b, imported=a)
    ]
    assert circles == [], f"import circles: {circles}"


def test_only_the_ledger_speaks_sql() -> None:
    graph = _graph()
    speakers = {
        importer
        for driver in ("psycopg", "psycopg_pool", "sqlalchemy", "alembic")
        if driver in graph.modules
        for importer in graph.find_modules_that_directly_import(driver)
    }
    outside = sorted(m for m in speakers if not (m == "rollout.ledger" or m.startswith("rollout.ledger.")))
    assert outside == [], f"SQL drivers imported outside rollout.ledger: {outside}"


def test_benchmarks_and_the_harness_never_import_tests() -> None:
    import re

    imports_tests = re.compile(r"^\s*(from tests[ .]|import tests\b)", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("benchmarks", "testing", "rollout", "scripts")
        for path in (ROOT / folder).rglob("*.py")
        if imports_tests.search(path.read_text())
    ]
    assert offenders == []


def test_only_the_run_settings_module_names_a_run_setting() -> None:
    """A run's settings are one record (`rollout.run.settings.RunSettings`): nothing else reads them by key
    (`….settings["paused"]`, `….settings.get("max_lag")`) or spells a per-policy setting's recorded name."""
    import ast

    owner = ROOT / "rollout" / "run" / "settings.py"
    offenders = []
    for folder in ("rollout", "benchmarks", "testing", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path in (owner, Path(__file__)):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                read: ast.expr | None = None  # what is read by key: `X[...]` or `X.get(...)`
                if isinstance(node, ast.Subscript):
                    read = node.value
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                ):
                    read = node.func.value
                by_key = isinstance(read, ast.Attribute) and read.attr == "settings"
                spelled = (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value.startswith(("external_model/", "policy_model/"))
                )
                if by_key or spelled:
                    offenders.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}")
    assert offenders == [], f"run settings read by key outside rollout.run.settings: {offenders}"
