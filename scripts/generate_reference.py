"""Generate docs/reference.md, the API reference of the `rollout` package, from the code itself.

    uv run python scripts/generate_reference.py          # rewrite docs/reference.md
    uv run python scripts/generate_reference.py --check  # exit 1 when docs/reference.md is stale

Contract:
- Every module of the `rollout` package is found by walking it with pkgutil and importing each module. A
  module that fails to import only because an optional extra of the distribution is not installed (a
  `ModuleNotFoundError` for a package named in `[project.optional-dependencies]`, such as vllm) is listed as
  "not importable here", with the extra to install. Any other import failure stops the generator with the
  module's name and the error: nothing is skipped silently.
- Per module: its docstring, the names it re-exports (`__all__` entries defined elsewhere), and its public
  classes and functions (names not starting with `_`, defined in that module) with their signatures and the
  first paragraph of their docstrings; a class also lists its public methods and properties, and an enum its
  members.
- The author API (`rollout.AUTHOR_API`: the modules an environment's author imports, and their `__all__`)
  comes first; every other module is listed after it as internal.
- The output is deterministic: modules and members sorted by name, no memory addresses, no timestamps, no
  paths of this machine. Regenerating an unchanged tree leaves no diff.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import inspect
import pkgutil
import re
import sys
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
PACKAGE = "rollout"
STALE = "docs/reference.md is stale: run `uv run python scripts/generate_reference.py`"
HEADER = """\
# API reference

Generated from the code by `scripts/generate_reference.py`; do not edit by hand. After changing a docstring or
a signature, regenerate it with `uv run python scripts/generate_reference.py` (`tests/test_reference.py` fails
while this page is stale). Each module's docstring states its contract; below it are the module's public
classes and functions, with the first paragraph of their docstrings. Modules whose names start with `_` are
private and not listed.

The author API comes first: the modules an environment's (or an eval suite's) author imports
(`rollout.AUTHOR_API`); the names in their `__all__` are kept stable across releases. Every other module is
internal to rollout: its names may change between releases.
"""

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class ModuleImportError(RuntimeError):
    """A module of the package failed to import for a reason other than a missing optional extra."""


@dataclass
class ModuleEntry:
    name: str
    module: ModuleType | None = None
    missing_extra: tuple[str, str] | None = None  # (the missing import, the extra that provides it)


@dataclass
class Extras:
    """Top-level import names provided by the distribution's optional extras, mapped to the extra's name."""

    by_import: dict[str, str] = field(default_factory=dict[str, str])

    @staticmethod
    def of_project(pyproject: Path) -> Extras:
        project = tomllib.loads(pyproject.read_text())["project"]
        by_import: dict[str, str] = {}
        for extra, requirements in sorted(project.get("optional-dependencies", {}).items()):
            for requirement in requirements:
                distribution = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
                by_import.setdefault(distribution.lower().replace("-", "_"), extra)
        return Extras(by_import)

    def providing(self, error: ModuleNotFoundError) -> str | None:
        top = (error.name or "").split(".")[0]
        return self.by_import.get(top)


def walk(package_name: str, extras: Extras) -> list[ModuleEntry]:
    """Every module of the package, imported, sorted by name."""
    package = importlib.import_module(package_name)
    entries: list[ModuleEntry] = []
    if getattr(package, "__file__", None) is not None:  # a namespace package has no file and no docstring
        entries.append(ModuleEntry(package_name, package))
    pending = [(list(package.__path__), package_name + ".")]
    while pending:
        path, prefix = pending.pop()
        for info in pkgutil.iter_modules(path, prefix):
            if info.name.rpartition(".")[2].startswith("_"):
                continue  # a private module: not part of the API (the page's header says so)
            entry = _import(info.name, extras)
            entries.append(entry)
            if info.ispkg and entry.module is not None:
                pending.append((list(entry.module.__path__), info.name + "."))
    return sorted(entries, key=lambda e: e.name)


def _import(name: str, extras: Extras) -> ModuleEntry:
    try:
        return ModuleEntry(name, importlib.import_module(name))
    except ModuleNotFoundError as error:
        extra = extras.providing(error)
        if extra is None:
            raise ModuleImportError(f"{name} does not import: {error}") from error
        return ModuleEntry(name, missing_extra=(str(error.name).split(".")[0], extra))
    except Exception as error:
        raise ModuleImportError(f"{name} does not import: {type(error).__name__}: {error}") from error


def first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return inspect.cleandoc(doc).split("\n\n", 1)[0].strip()


def own_doc(obj: Any) -> str | None:
    """The object's own docstring: never one inherited from a base class, never dataclasses' generated one."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    if not isinstance(doc, str):
        return None
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
        return None
    return doc


class _Source:
    """Text shown as is in a signature: an annotation kept as source (`from __future__ import annotations`)
    without its quotes, or a default value's stable spelling."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation(annotation: Any) -> Any:
    if isinstance(annotation, str):
        return _Source(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        # The type alone: its metadata (ORM columns, validation bounds) would swamp the signature.
        return _annotation(annotation.__origin__)
    return annotation


def _default(value: Any) -> Any:
    """A default's spelling that does not depend on the process: no addresses, no logger levels."""
    if value is inspect.Parameter.empty:
        return value
    if isinstance(value, enum.Enum):
        return _Source(f"{type(value).__name__}.{value.name}")
    if inspect.isroutine(value):
        return _Source(getattr(value, "__qualname__", getattr(value, "__name__", "<function>")))
    return _Source(_ADDRESS.sub("", repr(value)))


def signature(obj: Any, *, returns: bool = True, drop_first: bool = False) -> str | None:
    """`(parameters) -> returns` as the code declares them; `drop_first` leaves out a method's self or cls."""
    try:
        found = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    parameters = list(found.parameters.values())[1 if drop_first else 0 :]
    found = found.replace(
        parameters=[
            p.replace(annotation=_annotation(p.annotation), default=_default(p.default)) for p in parameters
        ],
        return_annotation=_annotation(found.return_annotation) if returns else inspect.Signature.empty,
    )
    text = str(found)
    if text == "(*args, **kwargs)":
        return None  # a Protocol's or an inherited generic constructor: says nothing
    return _ADDRESS.sub("", text)


def code(text: str) -> str:
    """`text` as one Markdown code span, whatever backticks it holds."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def is_function(obj: Any) -> bool:
    return inspect.isfunction(inspect.unwrap(obj)) if callable(obj) else False


def public_members(module: ModuleType) -> tuple[list[tuple[str, type]], list[tuple[str, Any]]]:
    classes: list[tuple[str, type]] = []
    functions: list[tuple[str, Any]] = []
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if isinstance(obj, type):
            classes.append((name, obj))
        elif is_function(obj):
            functions.append((name, obj))
    return classes, functions


def reexports(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if not isinstance(names, list | tuple):
        return []
    found = []
    for name in sorted(str(n) for n in names):
        obj = getattr(module, name, None)
        if not (isinstance(obj, type) or is_function(obj)):
            continue  # an instance's __module__ is its class's, not where it was made
        origin = getattr(obj, "__module__", None)
        if origin and origin != module.__name__:
            found.append(f"{code(name)} ({code(origin)})")
    return found


def method_entry(attribute: str, value: Any) -> str | None:
    """One line for a public method or property of a class, or None for any other attribute."""
    if isinstance(value, property):
        return f"- {code(attribute)} (property)" + _summary_suffix(value.__doc__)
    static = isinstance(value, staticmethod)
    kind = " (static method)" if static else " (class method)" if isinstance(value, classmethod) else ""
    function = value.__func__ if isinstance(value, staticmethod | classmethod) else value
    if not is_function(function):
        return None
    sig = signature(function, drop_first=not static) or "(…)"
    return f"- {code(_async(function) + attribute + sig)}{kind}" + _summary_suffix(own_doc(function))


def _summary_suffix(doc: str | None) -> str:
    summary = first_paragraph(doc)
    return f": {' '.join(summary.split())}" if summary else ""


def _async(function: Any) -> str:
    return "async " if inspect.iscoroutinefunction(inspect.unwrap(function)) else ""


def class_lines(name: str, cls: type) -> list[str]:
    is_enum = issubclass(cls, enum.Enum)
    bases = [b for b in cls.__bases__ if b is not object]
    kind = "enum" if is_enum else "class"
    from_bases = f", from {', '.join(code(b.__qualname__) for b in bases)}" if bases else ""
    lines = [f"### {code(name)} ({kind}{from_bases})", ""]
    sig = None if is_enum else signature(cls, returns=False)
    if sig is not None:
        lines += [code(name + sig), ""]
    summary = first_paragraph(own_doc(cls))
    if summary:
        lines += [summary, ""]
    if is_enum:
        members = ", ".join(code(f"{m.name} = {m.value!r}") for m in cls)
        if members:
            lines += [f"Members: {members}.", ""]
    methods = [
        m for a, v in sorted(cls.__dict__.items()) if not a.startswith("_") and (m := method_entry(a, v))
    ]
    if methods:
        lines += [*methods, ""]
    return lines


def function_lines(name: str, function: Any) -> list[str]:
    lines = [f"### {code(name)}", "", code(_async(function) + name + (signature(function) or "(…)")), ""]
    summary = first_paragraph(own_doc(function))
    if summary:
        lines += [summary, ""]
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than - and _ dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def module_lines(entry: ModuleEntry) -> list[str]:
    lines = [f"## {entry.name}", ""]
    if entry.missing_extra is not None:
        missing, extra = entry.missing_extra
        lines += [
            f"Not importable here: it needs {code(missing)}, from the {code(extra)} extra "
            f"({code(f'uv sync --extra {extra}')}).",
            "",
        ]
        return lines
    module = entry.module
    assert module is not None
    doc = module.__doc__
    lines += [inspect.cleandoc(doc) if doc else "(no module docstring)", ""]
    exported = reexports(module)
    if exported:
        lines += [f"Re-exports: {', '.join(exported)}.", ""]
    classes, functions = public_members(module)
    for name, cls in classes:
        lines += class_lines(name, cls)
    for name, function in functions:
        lines += function_lines(name, function)
    return lines


def render(entries: list[ModuleEntry], author_api: tuple[str, ...] = ()) -> str:
    by_name = {entry.name: entry for entry in entries}
    authors = [by_name[name] for name in author_api if name in by_name]
    internals = [entry for entry in entries if entry.name not in author_api]
    lines = [HEADER, "## The author API", ""]
    for entry in authors:
        names = getattr(entry.module, "__all__", ())
        shown = f": {', '.join(code(str(n)) for n in sorted(names))}" if names else ""
        lines.append(f"- [{entry.name}](#{anchor(entry.name)}){shown}")
    lines += ["", "## Internals", ""]
    lines += [f"- [{entry.name}](#{anchor(entry.name)})" for entry in internals]
    lines.append("")
    for entry in [*authors, *internals]:
        lines += module_lines(entry)
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def generate() -> str:
    """The reference page for the tree as it is."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    package = importlib.import_module(PACKAGE)
    return render(
        walk(PACKAGE, Extras.of_project(ROOT / "pyproject.toml")), getattr(package, "AUTHOR_API", ())
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/reference.md is stale")
    args = parser.parse_args(argv)
    try:
        text = generate()
    except ModuleImportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check:
        if not REFERENCE.exists() or REFERENCE.read_text() != text:
            print(STALE, file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
