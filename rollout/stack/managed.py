"""A service the stack runs as a detached process: started once, found again by its pid file, stopped by
`down`.

Contract:
- `start` is idempotent: a live process named by the pid file is left alone; a stale file is ignored.
- Ports are checked before starting, and a taken one is reported with the setting to change.
- `start` returns once the process accepts connections on every port (or raises with the tail of its log). A
  process that exits saying a port was taken after the check ("address already in use") is started again, up
  to `BIND_ATTEMPTS` times in all.
- The environment variables it was started with on top of ours (`env`) are recorded beside its pid file.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rollout.net import port_is_free
from rollout.stack.processes import (
    PortTakenError,
    read_pid_file,
    start_detached,
    terminate,
    wait_for_port,
    write_pid_file,
)

BIND_ATTEMPTS = 3
BIND_RACE = "address already in use"


@dataclass(frozen=True)
class ManagedProcess:
    name: str
    command: tuple[str, ...]
    data_dir: Path
    host: str
    ports: tuple[tuple[int, str], ...]  # (port, the setting that chooses it)
    # Environment variables set for the process on top of ours; recorded beside its pid file, so a later
    # command can tell what the running process was started with (`started_env`).
    env: tuple[tuple[str, str], ...] = ()

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "run" / f"{self.name.lower()}.pid"

    @property
    def env_path(self) -> Path:
        return self.data_dir / "run" / f"{self.name.lower()}.env.json"

    def started_env(self) -> dict[str, str]:
        """The `env` the running process was started with ({} when none is running or none was recorded)."""
        if self.pid() is None:
            return {}
        try:
            return dict(json.loads(self.env_path.read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / f"{self.name.lower()}.log"

    def pid(self) -> int | None:
        record = read_pid_file(self.pid_path)
        return record.pid if record else None

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process and record it, without waiting for its ports (`ports_ready` tells)."""
        for port, setting in self.ports:
            if not port_is_free(self.host, port):
                raise PortTakenError(self.name, self.host, port, setting)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        child = start_detached(list(self.command), self.log_path, env={**os.environ, **dict(self.env)})
        write_pid_file(self.pid_path, child.pid)
        self.env_path.write_text(json.dumps(dict(self.env)))
        return child

    def ports_ready(self) -> bool:
        """Whether something accepts connections on each of its ports right now."""
        return all(wait_for_port(self.host, port, timeout_s=0.2) for port, _ in self.ports)

    def start(self, timeout_s: float = 60) -> bool:
        """Start the process and wait for its ports; False when ours was already running."""
        if self.pid() is not None:
            return False
        attempt = 1
        while True:
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            pid = self.launch().pid
            if all(wait_for_port(self.host, port, timeout_s, pid) for port, _ in self.ports):
                return True
            terminate(pid)
            with self.log_path.open("rb") as log:
                log.seek(logged)
                said = log.read().decode(errors="replace")
            # A port free when checked can be taken before the process binds it (by another process, or by
            # the process itself: Temporal's dev server picks its internal services' ports at random).
            if attempt == BIND_ATTEMPTS or BIND_RACE not in said.lower():
                raise RuntimeError(f"{self.name} did not come up within {timeout_s:.0f}s:\n{said[-2000:]}")
            attempt += 1

    def stop(self) -> bool:
        pid = self.pid()
        if pid is not None:
            terminate(pid)
        self.pid_path.unlink(missing_ok=True)
        return pid is not None
