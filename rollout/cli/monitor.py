"""`rollout monitor`: the dashboard (Streamlit) on the current stack, in the foreground.

`rollout up` runs this same command as a supervised service (`services.monitor.*`); run it yourself to watch
another stack (`rollout monitor data_dir=…`) or on another port.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from rollout.cli.cluster import ClusterFlag, cluster_overrides, load_context
from rollout.cli.common import Overrides, err, fail, load_settings


def monitor(
    overrides: Overrides = None,
    host: Annotated[
        str | None, typer.Option(help="Address to bind (default: services.monitor.host).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: services.monitor.port).")] = None,
    cluster: ClusterFlag = False,
) -> None:
    """Open the dashboard: runs (curves, pause/resume/max_lag), transcripts (tokens coloured by logprob), the
    checkpoint tree, evals, and machines (services, engines, workers, sandboxes, leases). It reads the ledger
    and Temporal and keeps no state of its own. Binds 127.0.0.1 by default; another address needs a login
    token in $ROLLOUT_MONITOR_TOKEN. With --cluster it shows the current cluster context's runs (`rollout
    cluster connect`)."""
    from rollout.monitor.context import OVERRIDES_VARIABLE
    from rollout.monitor.login import TOKEN_VARIABLE
    from rollout.security.http_guard import LOOPBACK_NAMES, is_loopback

    if cluster:  # the dashboard, here, on the cluster's ledger and Temporal (no ingress needed)
        context = load_context()
        overrides = cluster_overrides(True, overrides)
        if context.monitor_url:
            err.print(f"the cluster's own dashboard: {context.monitor_url}", highlight=False)
    settings = load_settings(overrides)
    host = host or settings.services.monitor.host
    port = port or settings.services.monitor.port
    if not is_loopback(host) and not os.environ.get(TOKEN_VARIABLE):
        fail(
            f"the dashboard shows every transcript and pauses runs, so it binds {host} only behind a login: set "
            f"{TOKEN_VARIABLE} in its environment (a long random token; people then open it with ?token=...), "
            "or keep it on 127.0.0.1 and reach it through `ssh -L` or `kubectl port-forward`",
            code=2,
        )
    app = Path(__file__).resolve().parent.parent / "monitor" / "app.py"
    err.print(f"the dashboard: http://{host}:{port} (Ctrl-C stops it)", highlight=False)
    sys.stderr.flush()
    environment = os.environ | {OVERRIDES_VARIABLE: json.dumps(list(overrides or []))}
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
    ]
    if is_loopback(host):
        # Streamlit checks the websocket's Host against these (its data and actions go over it): a web page
        # that rebinds its own name to 127.0.0.1 sends that name and is refused, as the gateway refuses it.
        for name in sorted({*LOOPBACK_NAMES, host}):
            command += ["--server.allowedHosts", name]
    # The dashboard takes this process's place (and pid: the stack's supervisor keeps it by that pid).
    os.execve(sys.executable, command, environment)


def register(app: typer.Typer) -> None:
    app.command()(monitor)
