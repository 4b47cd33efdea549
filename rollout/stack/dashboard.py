"""The dashboard as a service of the embedded stack: the `rollout monitor` process `rollout up` keeps running.

Contract: `dashboard_process(settings)` is the supervised `ManagedProcess` (named `Monitor`, on
`services.monitor.host:port`), or None when `services.monitor.enabled` is false. It is started with
`dashboard_overrides(settings)`: the stack's addresses as the stack has them (an embedded Temporal by host and
ports, so the dashboard shows it as embedded and links into its web UI). It reads the ledger as the worker
role (no writes but through the runs' own updates) and reaches Temporal for the run controls; it is given the
gateway's model so transcripts decode tokens with the right tokenizer.
"""

from __future__ import annotations

import sys

from rollout.config import Settings
from rollout.stack.managed import ManagedProcess


def dashboard_overrides(settings: Settings) -> list[str]:
    """The settings the dashboard is started with: the stack's own addresses, so that it reads the services as
    the stack runs them (an embedded Temporal as embedded, with its web UI's address for the links)."""
    services = settings.services
    postgres, temporal, gateway = services.postgres, services.temporal, services.gateway
    overrides = [
        f"data_dir={settings.data_path}",
        f"models_dir={settings.models_dir}",
        f"services.postgres.host={postgres.host}",
        f"services.postgres.port={postgres.port}",
        f"services.temporal.namespace={temporal.namespace}",
        f"services.gateway.enabled={str(gateway.enabled).lower()}",
        f"services.gateway.model={gateway.model}",
        f"services.gateway.host={gateway.host}",
        f"services.gateway.port={gateway.port}",
        f"services.gateway.engine_port={gateway.engine_port}",
    ]
    if postgres.worker_url or postgres.url:  # a server of the user's own: the URL services connect with
        overrides += [f"services.postgres.worker_url={settings.worker_ledger_url}"]
    if temporal.address:  # a Temporal of the user's own
        overrides += [f"services.temporal.address={temporal.address}"]
        if temporal.ui_url:
            overrides += [f"services.temporal.ui_url={temporal.ui_url}"]
    else:
        overrides += [
            f"services.temporal.host={temporal.host}",
            f"services.temporal.port={temporal.port}",
            f"services.temporal.ui_port={temporal.ui_port}",
        ]
    return overrides


def dashboard_process(settings: Settings) -> ManagedProcess | None:
    monitor = settings.services.monitor
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
            *dashboard_overrides(settings),
        ),
        data_dir=settings.data_path,
        host=monitor.host,
        ports=((monitor.port, "services.monitor.port"),),
    )
