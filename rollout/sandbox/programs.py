"""What of this machine a jailed program needs to read to start: its own install, and its interpreter's, but
never a Python environment's installed packages beyond those it runs on.

Contract:
- `program_install(name, search_path, packages=)` finds `name` as a shell would (a bare name on `search_path`,
  a path as it is), follows its links, and answers a `ProgramInstall`: `readable`, the folders and files a
  jail binds read-only at the same path; `masked`, folders inside those that a jail shows empty but for the
  `readable` paths inside them; and `bin_dirs`, the folders to put on the jail's PATH. A jail's root already
  has the system's directories (`SYSTEM`), so a program there needs nothing (the system's own Python
  packages included: install graders' packages in a virtual environment, never into `/usr`). Elsewhere:
  - inside a Node package tree (a `node_modules` folder on its path): that outermost `node_modules` folder;
  - in a Python virtual environment (a `pyvenv.cfg` in the folder above its `bin`): that file, the `bin`
    folder, and the base interpreter's install; never the environment whole, whose packages may hold a
    grader's answers (a non-editable environment package);
  - a Python install's interpreter (`lib/pythonX.Y` beside its `bin`): that install's `bin` and `lib`, its
    `site-packages` masked (its own virtual environments' too, where they live inside it);
  - anything else: the file itself (never the folder around it: that may be a home directory).
  A script's `#!` interpreter is added the same way (`#!/usr/bin/env NAME` looks NAME up on `search_path`).
- Of a Python environment's installed packages (its `site-packages`, and its base's when it includes them) a
  jail reads only the distributions the program needs: the one that installed it (a console script) and
  `packages` (distribution names), each with what it requires, transitively (its markers evaluated for this
  interpreter). A distribution is read as the top-level folders and modules its RECORD lists; an editable
  one's source folder (what its `.pth` names) is not: name that in the seat's `readable`. `packages` is
  ignored for a program that runs on no Python environment of its own (the system's interpreter, Node).
- `ProgramNotFound` says which program, or which of `packages`, could not be found, and where it was looked
  for.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement

SYSTEM = (Path("/usr"), Path("/bin"), Path("/sbin"), Path("/lib"), Path("/lib64"))


class ProgramNotFound(LookupError):
    """A command's program (or a Python distribution it runs on) is not on this machine."""


@dataclass(frozen=True)
class ProgramInstall:
    readable: tuple[Path, ...] = ()
    bin_dirs: tuple[Path, ...] = ()
    masked: tuple[Path, ...] = ()  # inside `readable`: shown empty but for the readable paths within

    def __or__(self, other: ProgramInstall) -> ProgramInstall:
        def union(a: tuple[Path, ...], b: tuple[Path, ...]) -> tuple[Path, ...]:
            return tuple(dict.fromkeys((*a, *b)))

        return ProgramInstall(
            union(self.readable, other.readable),
            union(self.bin_dirs, other.bin_dirs),
            union(self.masked, other.masked),
        )


def _in_system(path: Path) -> bool:
    return any(path.is_relative_to(top) for top in SYSTEM)


def _find(name: str, search_path: str) -> Path:
    found = shutil.which(name, path=search_path) if "/" not in name else name
    if found is None or not Path(found).is_file():
        raise ProgramNotFound(f"the program {name!r} is not on this machine (looked on PATH={search_path})")
    return Path(found)


def _shebang(path: Path) -> list[str]:
    try:
        with path.open("rb") as file:
            first = file.readline(256)
    except OSError:
        return []
    if not first.startswith(b"#!"):
        return []
    return first[2:].decode(errors="replace").split()


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _site_packages(prefix: Path) -> list[Path]:
    return sorted(path for path in prefix.glob("lib/python3*/site-packages") if path.is_dir())


def _venv_config(prefix: Path) -> dict[str, str]:
    try:
        lines = (prefix / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return {}
    return {key.strip(): value.strip() for key, _, value in (line.partition("=") for line in lines)}


def _venv_of(program: Path) -> Path | None:
    """The virtual environment whose `bin` holds `program`, if any (outside the system's directories)."""
    prefix = program.parent.parent
    if program.parent.name == "bin" and (prefix / "pyvenv.cfg").is_file() and not _in_system(prefix):
        return prefix
    return None


def _python_install_of(executable: Path) -> Path | None:
    """The Python install (not a virtual environment) whose interpreter `executable` is."""
    prefix = executable.parent.parent
    if executable.parent.name == "bin" and any(prefix.glob("lib/python3*")):
        return prefix
    return None


@dataclass(frozen=True)
class _Distribution:
    site: Path
    requires: tuple[str, ...]
    entries: tuple[Path, ...]  # what of `site` it installed: top-level folders and modules, its metadata
    scripts: frozenset[Path]  # the console scripts it installed (absolute, unresolved)


def _distributions(sites: Sequence[Path]) -> dict[str, _Distribution]:
    found: dict[str, _Distribution] = {}
    for site in sites:
        for dist in importlib.metadata.distributions(path=[str(site)]):
            name = dist.metadata["Name"]
            if not name or _normalized(name) in found:  # the first on the path wins, as for an import
                continue
            entries: dict[Path, None] = {}
            scripts: set[Path] = set()
            for file in dist.files or ():
                parts = PurePosixPath(file).parts
                if not parts:
                    continue
                if parts[0] == "..":
                    scripts.add(Path(site, *parts).resolve(strict=False).parent / parts[-1])
                elif parts[0] == "__pycache__":  # a single module's bytecode: that file, not the folder
                    entries[site.joinpath(*parts)] = None
                else:
                    entries[site / parts[0]] = None
            found[_normalized(name)] = _Distribution(
                site, tuple(dist.requires or ()), tuple(e for e in entries if e.exists()), frozenset(scripts)
            )
    return found


def _required(requirement: str, extras: frozenset[str]) -> tuple[str, frozenset[str]] | None:
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement:
        return None
    if parsed.marker is not None:
        wanted = [{"extra": extra} for extra in (extras or {""})]
        if not any(parsed.marker.evaluate(environment) for environment in wanted):
            return None
    return _normalized(parsed.name), frozenset(parsed.extras)


def _closure(
    dists: dict[str, _Distribution], roots: Iterable[tuple[str, frozenset[str]]]
) -> list[_Distribution]:
    seen: dict[tuple[str, frozenset[str]], None] = {}
    pending = list(roots)
    while pending:
        name, extras = pending.pop()
        if (name, extras) in seen or name not in dists:
            continue
        seen[(name, extras)] = None
        for requirement in dists[name].requires:
            if (required := _required(requirement, extras)) is not None:
                pending.append(required)
    return [dists[name] for name in dict.fromkeys(name for name, _ in seen)]


def _packages_read(
    sites: Sequence[Path], program: Path | None, packages: Sequence[str], interpreter: Path
) -> tuple[Path, ...]:
    """The `site-packages` entries a program run by `interpreter` reads (see the contract)."""
    dists = _distributions(sites)
    roots = [(_normalized(name), frozenset[str]()) for name in packages]
    if missing := [name for name, (key, _) in zip(packages, roots, strict=True) if key not in dists]:
        where = ", ".join(map(str, sites)) or "nowhere: it has no site-packages"
        raise ProgramNotFound(
            f"the Python package(s) {missing} are not installed for {interpreter} (in {where})"
        )
    if program is not None:
        script = program.parent.resolve() / program.name
        roots += [(key, frozenset[str]()) for key, dist in dists.items() if script in dist.scripts]
    return tuple(entry for dist in _closure(dists, roots) for entry in dist.entries)


def _python_install(prefix: Path, packages: Sequence[str]) -> ProgramInstall:
    """A Python install (not a virtual environment): its `bin` and `lib` (never the whole prefix: pyenv keeps
    virtual environments in `envs/` there, conda its packages, `~/.local` its `share/`), its site-packages
    masked but for `packages`."""
    sites = _site_packages(prefix)
    read = _packages_read(sites, None, packages, prefix / "bin")
    parts = tuple(prefix / part for part in ("bin", "lib", "lib64") if (prefix / part).is_dir())
    return ProgramInstall((*parts, *read), (prefix / "bin",), tuple(sites))


def _virtual_environment(prefix: Path, program: Path, packages: Sequence[str]) -> ProgramInstall:
    config = _venv_config(prefix)
    base = Path(config["home"]).resolve().parent if config.get("home") else None
    sites = _site_packages(prefix)
    # Masked too: a venv may live inside a bound install (pyenv's `versions/X/envs/NAME`).
    install = ProgramInstall((prefix / "pyvenv.cfg", prefix / "bin"), (prefix / "bin",), tuple(sites))
    if base is not None and not _in_system(base):
        install |= _python_install(base, ())
        if config.get("include-system-site-packages", "").lower() == "true":
            sites += _site_packages(base)
    return install | ProgramInstall(_packages_read(sites, program, packages, prefix / "bin"))


def program_install(
    name: str, search_path: str, packages: Sequence[str] = (), *, _depth: int = 0
) -> ProgramInstall:
    found = _find(name, search_path)
    # A venv's python is a link to its base interpreter: the venv is what it runs in, so look before
    # resolving.
    program, executable = found.absolute(), found.resolve()
    venv = _venv_of(program) or _venv_of(executable)
    install = ProgramInstall()
    if venv is not None:
        install |= _virtual_environment(venv, program if _venv_of(program) else executable, packages)
    elif not _in_system(executable):
        parts = executable.parts
        if "node_modules" in parts:
            install |= ProgramInstall((Path(*parts[: parts.index("node_modules") + 1]),), (program.parent,))
        elif (python := _python_install_of(executable)) is not None:
            install |= _python_install(python, packages)
        else:
            install |= ProgramInstall((executable,), (program.parent,))
    interpreter = _shebang(executable)
    if interpreter and _depth < 2:
        if Path(interpreter[0]).name == "env":  # `env NAME` or `env -S NAME ARGS`
            interpreter = [part for part in interpreter[1:] if not part.startswith("-")][:1]
        if interpreter:
            install |= program_install(interpreter[0], search_path, packages, _depth=_depth + 1)
    return install
