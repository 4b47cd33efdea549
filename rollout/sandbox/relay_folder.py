"""Where a jail's relay lives outside it: a folder the jail reads, holding `relay.py` and the Unix sockets it pumps to.

Contract:
- `RelayFolder.create(folder)` makes `folder` (mode 0755, whatever the umask: the jail's uid reads the relay and
  reaches the sockets; each socket is 0600 and the jail's own) and copies rollout.sandbox.relay into it.
  `readable` is what a jail must be able to read to run it (the bare interpreter's install, and the folder);
  `argv(pairs)` is the command prefix that runs a jailed command behind the relay, each (port, socket name) pair
  a port of the jail's loopback pumped to that socket of the folder. `remove()` deletes the folder.
- The relay runs on this interpreter's own install, not its virtual environment's: it needs the standard
  library only.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollout.sandbox import relay
from rollout.sandbox.jail import BASE_ENV
from rollout.sandbox.programs import program_install


def base_interpreter() -> str:
    """This interpreter's own install, not its virtual environment's: the relay needs the standard library only."""
    return str(getattr(sys, "_base_executable", sys.executable))


@dataclass(frozen=True)
class RelayFolder:
    folder: Path
    readable: tuple[Path, ...]

    @classmethod
    def create(cls, folder: Path) -> RelayFolder:
        interpreter = base_interpreter()
        python = program_install(interpreter, BASE_ENV["PATH"])
        folder.mkdir(parents=True, mode=0o755, exist_ok=True)
        folder.chmod(0o755)
        shutil.copyfile(relay.__file__, folder / "relay.py")
        return cls(folder, (*python.readable, folder))

    def socket(self, name: str) -> Path:
        return self.folder / name

    def argv(self, pairs: Sequence[tuple[int, str]]) -> tuple[str, ...]:
        if not pairs:
            return ()
        argv: tuple[str, ...] = (base_interpreter(), "-I", "-S", str(self.folder / "relay.py"))
        for port, name in pairs:
            argv += (str(port), str(self.socket(name)))
        return (*argv, "--")

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
