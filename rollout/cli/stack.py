"""`rollout up`, `status` and `down`: the embedded stack, started, reported and stopped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from rollout.cli.cluster import ClusterFlag, cluster_overrides, load_context
from rollout.cli.common import JsonFlag, Overrides, err, load_settings, out
from rollout.control.connections import stack_action
from rollout.control.tracking import feeding, tracking_line

if TYPE_CHECKING:
    from rollout.control.tracking import TrackingState
    from rollout.stack.embedded import ServiceStatus


def print_status(services: list[ServiceStatus], as_json: bool, feeds: Sequence[TrackingState] = ()) -> None:
    """The services as a table (or JSON), and how each running run's tracking feed stands."""
    if as_json:
        healthy = all(service.healthy for service in services)
        shown = {"healthy": healthy, "services": [s.as_json() for s in services]}
        print(
            json.dumps(
                shown | {"tracking": [asdict(f) | {"said": tracking_line(f)} for f in feeds]}, indent=2
            )
        )
        return
    table = Table(title="rollout services")
    for column in ("service", "mode", "address", "health", "restarts", "detail"):
        table.add_column(column, overflow="fold")
    for service in services:
        health = "[green]healthy[/]" if service.healthy else "[red]down[/]"
        restarts = str(service.restarts) if service.restarts else ""
        if service.last_exit:
            restarts += f" (last: {service.last_exit})"
        table.add_row(service.name, service.mode, service.address, health, restarts, service.detail)
    out.print(table)
    for service in services:
        if service.ui_url:
            out.print(f"Temporal web UI: {service.ui_url}")
    for feed in feeds:
        out.print(f"run {feed.run} · {tracking_line(feed)}", highlight=False, markup=False)


def up(overrides: Overrides = None, as_json: JsonFlag = False) -> None:
    """Start the embedded stack (Postgres, Temporal with its web UI, the blob directory, an engine, the
    gateway and a runner) and migrate the ledger.

    Services with a URL configured are used as they are; nothing is started for them.
    Running `up` again is harmless. The runner imports environments from the directory `up` runs in and from
    $PYTHONPATH.
    """
    from rollout.stack.embedded import Stack

    stack = Stack(load_settings(overrides))
    if as_json:
        services = stack_action(stack.up)
    else:
        with err.status("starting the embedded stack…") as spinner:
            services = stack_action(lambda: stack.up(report=lambda line: spinner.update(line)))
    print_status(services, as_json)
    if not all(service.healthy for service in services):
        raise typer.Exit(1)


def status(overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False) -> None:
    """Report every service: address, health, what each engine serves, and the Temporal web UI URL, and how
    each playing run's W&B and MLflow feed stands (`tracking.backends`). Exits 1 when a service is down.
    With --cluster, the current cluster context's services instead (the ledger, Temporal, the blob store, the
    gateway and the dashboard), probed from here."""
    if cluster:
        from rollout.stack.health import cluster_status

        context = load_context()
        settings = load_settings(cluster_overrides(True, overrides))
        services = cluster_status(settings, context.gateway_url, context.monitor_url)
    else:
        from rollout.stack.embedded import Stack

        settings = load_settings(overrides)
        services = stack_action(Stack(settings).status)
    feeds = asyncio.run(feeding(settings)) if all(s.healthy for s in services if s.name == "temporal") else []
    print_status(services, as_json, feeds)
    if not all(service.healthy for service in services):
        raise typer.Exit(1)


def down(overrides: Overrides = None) -> None:
    """Stop what `rollout up` started, within 30 s: each service is asked to stop and killed if it has not by
    its deadline (the output names those). External services are left alone; state stays in the data
    directory."""
    from rollout.stack.embedded import Stack

    with err.status("stopping the stack…") as spinner:
        done = stack_action(lambda: Stack(load_settings(overrides)).down(report=spinner.update))
    out.print(
        f"stopped: {', '.join(done.stopped)}" if done.stopped else "nothing was running", highlight=False
    )
    if done.killed:
        out.print(
            f"killed (they had not stopped when asked, by their deadline): {', '.join(done.killed)}; "
            "their logs are in the data directory's logs/ folder",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(status)
    app.command()(down)
