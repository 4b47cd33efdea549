"""What the dashboard's views read through: settings, the ledger, Temporal, the embedded stack's status.

Contract:
- `Monitor.from_environment()` loads settings from the overrides in `$ROLLOUT_MONITOR_OVERRIDES` (a JSON list,
  set by `rollout monitor`), so the app reads the same stack as the command that started it.
- `read(query)` runs one async ledger query (rollout.control.reads) on a fresh connection with a short
  reconnect window: a ledger that is down raises `LedgerUnreachable` within seconds (the app shows a banner
  and tries again), never hangs a view.
- `temporal(call)` does the same with a Temporal client; `update_run` is the run control `rollout run
  pause|resume|set` and the gateway's operator routes use (rollout.control.runs), so every change goes through
  the run's workflow and is recorded in the ledger by the run itself.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from rollout import config

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout.control.reads import LedgerReader
    from rollout.run.settings import RunChange, RunStatus

OVERRIDES_VARIABLE = "ROLLOUT_MONITOR_OVERRIDES"
LEDGER_PATIENCE_S = 2.0
UPDATE_WINDOW_S = 5.0  # how long a button rides out Temporal's bad moments before it says so


@dataclass(frozen=True)
class Monitor:
    settings: config.Settings

    @staticmethod
    def from_environment() -> Monitor:
        overrides = json.loads(os.environ.get(OVERRIDES_VARIABLE) or "[]")
        return Monitor(config.load(list(overrides)))

    def read[T](self, query: Callable[[LedgerReader], Awaitable[T]]) -> T:
        from rollout.control.reads import read_ledger

        return asyncio.run(read_ledger(self.settings, query, LEDGER_PATIENCE_S))

    def temporal[T](self, call: Callable[[Client], Awaitable[T]]) -> T:
        from temporalio.client import Client

        from rollout.security.temporal_tls import temporal_tls

        async def go() -> T:
            temporal = self.settings.services.temporal
            client = await Client.connect(
                self.settings.temporal_address, namespace=temporal.namespace, tls=temporal_tls(temporal)
            )
            return await call(client)

        return asyncio.run(go())

    def update_run(self, run: str, change: RunChange) -> RunStatus:
        """`change` made to `run` by the run control every face uses (rollout.control.runs.update_run); a
        `ControlError` says why not. A page waits a few seconds at most for Temporal."""
        from rollout.control.runs import update_run

        return asyncio.run(update_run(self.settings, run, change, window_s=UPDATE_WINDOW_S))

    def workflow_url(self, workflow_id: str) -> str | None:
        """The Temporal web UI's page of a workflow, when the UI's address is known."""
        ui = self.settings.temporal_ui_url
        if ui is None:
            return None
        namespace = self.settings.services.temporal.namespace
        return f"{ui}/namespaces/{namespace}/workflows/{quote(workflow_id, safe='')}"
