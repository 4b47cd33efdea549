"""docs/reference.md is what scripts/generate_reference.py makes of the code now: a changed docstring or
signature without a regenerated page fails here, with the command that fixes it. The generator reports a
module that needs a missing optional extra instead of crashing, and stops on any other import failure."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "generate_reference.py"


def test_the_api_reference_is_current() -> None:
    # A fresh interpreter, as a user runs it: the generator imports every module of the package.
    checked = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr.strip() or checked.stdout.strip()


@pytest.fixture
def generator() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("generate_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture
def demo_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An importable package of its own (a fresh name), forgotten by the import system afterwards."""
    name = f"refdemo_{uuid.uuid4().hex[:8]}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text('"""A package to document."""\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield name, package
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_a_missing_extra_is_reported_and_any_other_import_failure_stops(
    generator: ModuleType, demo_package: tuple[str, Path]
) -> None:
    name, package = demo_package
    (package / "needs_extra.py").write_text("import heavy_extra_not_installed\n")
    extras = generator.Extras({"heavy_extra_not_installed": "heavy"})

    entries = generator.walk(name, extras)
    assert [(e.name, e.missing_extra) for e in entries] == [
        (name, None),
        (f"{name}.needs_extra", ("heavy_extra_not_installed", "heavy")),
    ]
    page = generator.render(entries)
    assert "Not importable here: it needs `heavy_extra_not_installed`, from the `heavy` extra" in page

    (package / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(
        generator.ModuleImportError, match=rf"{name}\.broken does not import: RuntimeError: boom"
    ):
        generator.walk(name, extras)


def test_the_author_api_is_every_name_the_shipped_environments_import_from_rollout() -> None:
    """The author API (`rollout.AUTHOR_API`, each module's `__all__`) names what exists, and the shipped
    environments, written as an author would, import nothing else of rollout's author-facing modules."""
    import ast
    import importlib

    import rollout

    public: dict[str, set[str]] = {}
    for name in rollout.AUTHOR_API:
        module = importlib.import_module(name)
        public[name] = set(module.__all__)
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert missing == [], f"{name}.__all__ names what it lacks: {missing}"
    root = Path(__file__).resolve().parents[1]
    outside = set()
    for path in (root / "envs").rglob("*.py"):
        if "dataset" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in public:
                outside |= {
                    f"{node.module}.{a.name}" for a in node.names if a.name not in public[node.module]
                }
    assert outside == set(), f"the shipped environments use names outside the author API: {sorted(outside)}"
