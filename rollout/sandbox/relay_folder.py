"""Where a jail's relay lives outside it: a folder the jail reads, holding `relay.py` and the Unix sockets it
pumps to.

Contract:
- `RelayFolder.create(folder)` makes `folder` (mode 0755, whatever the umask: the jail's uid reads the relay
  and reaches the sockets; each socket is 0600 and the jail's own) and copies rollout.sandbox.relay into it.
  `readable` is what a jail must be able to read to run it (the bare interpreter's install, and the folder),
  and `masked` what of that it shows empty (rollout.sandbox.programs); a jail whose commands must not share
  the folder's sockets reads `interpreter`'s paths only, and each command `binds` the relay and its own
  sockets; `argv(pairs)` is the command prefix that runs a jailed command behind the relay, each (port, socket
  name) pair a port of the jail's loopback pumped to that socket of the folder. `remove()` deletes the folder.
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
from rollout.sandbox.programs import ProgramInstall, program_install


def base_interpreter() -> str:
    """This interpreter's own install, not its virtual environment's: the relay needs the standard library
    only."""
    return str(getattr(sys, "_base_executable", sys.executable))


@dataclass(frozen=True)
class RelayFolder:
    folder: Path
    interpreter: ProgramInstall  # what runs the relay: the bare interpreter's install

    @classmethod
    def create(cls, folder: Path) -> RelayFolder:
        python = program_install(base_interpreter(), BASE_ENV["PATH"])
        folder.mkdir(parents=True, mode=0o755, exist_ok=True)
        folder.chmod(0o755)
        shutil.copyfile(relay.__file__, folder / "relay.py")
        return cls(folder, python)

    @property
    def readable(self) -> tuple[Path, ...]:
        return (*self.interpreter.readable, self.folder)

    @property
    def masked(self) -> tuple[Path, ...]:
        return self.interpreter.masked

    def binds(self, pairs: Sequence[tuple[int, str]]) -> tuple[Path, ...]:
        """What one command behind `argv(pairs)` must read besides `interpreter`: the relay and its own
        sockets, and none of the folder's others (another seat's, say)."""
        if not pairs:
            return ()
        return (self.folder / "relay.py", *(self.socket(name) for _, name in pairs))

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
