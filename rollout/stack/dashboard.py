"""The dashboard as a service of the embedded stack: the `rollout monitor` process `rollout up` keeps running.

Contract: `dashboard_process(settings)` is the supervised `ManagedProcess` (named `Monitor`, on
`services.monitor.host:port`), or None when `services.monitor.enabled` is false. It reads the ledger as the
worker role (no writes but through the runs' own updates) and reaches Temporal for the run controls; it is given
the gateway's model so transcripts decode tokens with the right tokenizer.
"""

from __future__ import annotations

import sys

from rollout.config import Settings
from rollout.stack.managed import ManagedProcess


def dashboard_process(settings: Settings) -> ManagedProcess | None:
    services = settings.services
    monitor, gateway = services.monitor, services.gateway
    if not monitor.enabled:
        return None
    return ManagedProcess(
        name="Monitor",
        command=(
            sys.executable,
            "-m",
            "rollout.cli",
            "monitor",
            "--host",
            monitor.host,
            "--port",
            str(monitor.port),
            f"data_dir={settings.data_path}",
            f"models_dir={settings.models_dir}",
            f"services.postgres.worker_url={settings.worker_ledger_url}",
            f"services.postgres.host={services.postgres.host}",
            f"services.postgres.port={services.postgres.port}",
            f"services.temporal.address={settings.temporal_address}",
            f"services.temporal.ui_port={services.temporal.ui_port}",
            f"services.gateway.model={gateway.model}",
            f"services.gateway.host={gateway.host}",
            f"services.gateway.port={gateway.port}",
            f"services.gateway.engine_port={gateway.engine_port}",
        ),
        data_dir=settings.data_path,
        host=monitor.host,
        ports=((monitor.port, "services.monitor.port"),),
    )
