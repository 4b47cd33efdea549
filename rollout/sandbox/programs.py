"""What of this machine a jailed program needs to read to start: its own install, and its interpreter's.

Contract:
- `program_install(name, search_path)` finds `name` as a shell would (a bare name on `search_path`, a path as
  it is), follows its links, and answers a `ProgramInstall`: `readable`, the folders and files a jail binds
  read-only at the same path, and `bin_dirs`, the folders to put on the jail's PATH. A jail's root already has
  the system's directories (`SYSTEM`), so a program there needs nothing. Elsewhere:
  - inside a Node package tree (a `node_modules` folder on its path): that outermost `node_modules` folder;
  - in a Python virtual environment (a `pyvenv.cfg` in the folder above its `bin`): the environment, and its
    base interpreter's install;
  - a Python install's interpreter (`lib/pythonX.Y` beside its `bin`): that install;
  - anything else: the file itself (never the folder around it: that may be a home directory).
  A script's `#!` interpreter is added the same way (`#!/usr/bin/env NAME` looks NAME up on `search_path`).
- `ProgramNotFound` says which program could not be found, and where it was looked for.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

SYSTEM = (Path("/usr"), Path("/bin"), Path("/sbin"), Path("/lib"), Path("/lib64"))


class ProgramNotFound(LookupError):
    """A command's program is not on this machine."""


@dataclass(frozen=True)
class ProgramInstall:
    readable: tuple[Path, ...] = ()
    bin_dirs: tuple[Path, ...] = ()

    def __or__(self, other: ProgramInstall) -> ProgramInstall:
        def union(a: tuple[Path, ...], b: tuple[Path, ...]) -> tuple[Path, ...]:
            return tuple(dict.fromkeys((*a, *b)))

        return ProgramInstall(union(self.readable, other.readable), union(self.bin_dirs, other.bin_dirs))


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


def _install_of(executable: Path) -> Path:
    """The folder (or file) that holds what `executable` (a resolved path) needs."""
    parts = executable.parts
    if "node_modules" in parts:
        return Path(*parts[: parts.index("node_modules") + 1])
    if executable.parent.name == "bin":
        prefix = executable.parent.parent
        if (prefix / "pyvenv.cfg").is_file() or any(prefix.glob("lib/python3*")):
            return prefix
    return executable


def _venv_base(prefix: Path) -> Path | None:
    """A virtual environment's base interpreter install (`home` in its pyvenv.cfg names that install's
    bin)."""
    try:
        lines = (prefix / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve().parent
    return None


def program_install(name: str, search_path: str, *, _depth: int = 0) -> ProgramInstall:
    found = _find(name, search_path)
    # A venv's python is a link to its base interpreter: the venv is what it runs in, so look before
    # resolving.
    unresolved_prefix = found.absolute().parent.parent
    install = ProgramInstall()
    if (unresolved_prefix / "pyvenv.cfg").is_file() and not _in_system(unresolved_prefix):
        install |= ProgramInstall((unresolved_prefix,), (unresolved_prefix / "bin",))
        base = _venv_base(unresolved_prefix)
        if base is not None and not _in_system(base):
            install |= ProgramInstall((base,))
    executable = found.resolve()
    if not _in_system(executable):
        held = _install_of(executable)
        install |= ProgramInstall((held,), (found.absolute().parent,))
        if held != executable and (held / "pyvenv.cfg").is_file() and (base := _venv_base(held)) is not None:
            install |= ProgramInstall((base,))
    interpreter = _shebang(executable)
    if interpreter and _depth < 2:
        if Path(interpreter[0]).name == "env":  # `env NAME` or `env -S NAME ARGS`
            interpreter = [part for part in interpreter[1:] if not part.startswith("-")][:1]
        if interpreter:
            install |= program_install(interpreter[0], search_path, _depth=_depth + 1)
    return install
