"""Host one sandbox: build its world, serve it over HTTP, and keep it in its pool for as long as the block
runs.

- `rollout sandbox serve` is this in a process of its own; env checks and tests use it in process. The world
  is closed when hosting ends (a kind that runs a server process stops it there). A kind that runs anything in
  a jail (`jailed`: what agents choose, a world's own server) is built with the host's `isolation`
  (rollout.sandbox.jail). The server proves claims, and its place in the pool, with `key`, its kind's key
  (rollout.sandbox.keys.load_host_key) and answers to loopback names, and to the names of `host` when it
  listens beyond loopback. No claim's network may name `refused_endpoints` (`stack_endpoints(settings)`: the
  ledger, Temporal, the engine, the gateway and the dashboard, as the settings name them). A kind that serves
  command seats (`serves_command_seats`: the command host) is told which of this machine's folders a claim may
  have its seats read (`readable_roots`) and which never (`refused_roots`: the data directory).
  `sandbox_workdir` is where a served sandbox keeps its world: outside the data directory (a jail binds it,
  and nothing of the data directory may be reachable from there), in this user's own folder of the machine's
  temporary folder (rollout.sandbox.private_root: no other user plants it).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from rollout.config import SandboxIsolation, Settings
from rollout.ledger import Ledger
from rollout.net import reachable_host, serving
from rollout.sandbox.claims import SandboxPool, SandboxRegistration
from rollout.sandbox.private_root import private_root
from rollout.sandbox.server import LOOPBACK_HOSTS, build_sandbox_app
from rollout.sandbox.world import SandboxWorld, jailed, load_kind
from rollout.security.isolation import Endpoint


def sandbox_workdir(data_path: Path, kind: str, name: str) -> Path:
    stack = hashlib.sha256(str(data_path).encode()).hexdigest()[:12]  # one folder per data directory
    folder, box = (re.sub(r"[^A-Za-z0-9#_-]+", "-", part) for part in (kind, name))  # never `..` or `/`
    return private_root() / stack / folder / box


def stack_endpoints(settings: Settings) -> frozenset[Endpoint]:
    """The stack's own services as `settings` name them: what no sandbox's network may reach."""
    services = settings.services
    found = {
        Endpoint(services.gateway.host, services.gateway.port),
        Endpoint(services.gateway.engine_host, services.gateway.engine_port),
        Endpoint(services.monitor.host, services.monitor.port),
        Endpoint(services.temporal.host, services.temporal.port),
        Endpoint(services.temporal.host, services.temporal.ui_port),
        Endpoint(services.postgres.host, services.postgres.port),
    }
    for url in (settings.ledger_url, *settings.service_ledger_urls, f"tcp://{settings.temporal_address}"):
        parts = urllib.parse.urlsplit(url)
        with contextlib.suppress(ValueError):
            if parts.hostname and parts.port:
                found.add(Endpoint(parts.hostname, parts.port))
    return frozenset(found)


def build_world(
    kind: str,
    workdir: Path,
    seats: int,
    isolation: SandboxIsolation,
    readable_roots: Sequence[Path] = (),
    refused_roots: Sequence[Path] = (),
) -> SandboxWorld:
    factory = load_kind(kind)
    if getattr(factory, "serves_command_seats", False):  # its claims name programs and paths of this host
        return factory(
            workdir, seats, isolation=isolation, readable_roots=readable_roots, refused_roots=refused_roots
        )
    if jailed(factory):
        return factory(workdir, seats, isolation=isolation)
    return factory(workdir, seats)


def answering_hosts(host: str) -> frozenset[str]:
    """The `Host` names a sandbox listening on `host` answers to."""
    if host in LOOPBACK_HOSTS:
        return LOOPBACK_HOSTS
    named = {reachable_host(host), socket.gethostname()} | (
        {host} if host not in ("0.0.0.0", "::", "") else set()
    )
    return LOOPBACK_HOSTS | frozenset(named)


@asynccontextmanager
async def hosted_sandbox(
    ledger: Ledger,
    kind: str,
    name: str,
    *,
    seats: int,
    workdir: Path,
    key: bytes,
    host: str = "127.0.0.1",
    port: int | None = None,
    host_ttl_s: float = 30,
    isolation: SandboxIsolation = SandboxIsolation.bwrap,
    refused_endpoints: frozenset[Endpoint] = frozenset(),
    readable_roots: Sequence[Path] = (),
    refused_roots: Sequence[Path] = (),
) -> AsyncIterator[SandboxRegistration]:
    world = build_world(kind, workdir, seats, isolation, readable_roots, refused_roots)
    try:
        app = build_sandbox_app(
            world,
            kind=kind,
            name=name,
            seats=seats,
            key=key,
            hosts=answering_hosts(host),
            refused_endpoints=refused_endpoints,
        )
        async with serving(app, host, port) as url:
            registration = SandboxRegistration(kind=kind, name=name, address=url, seats=seats)
            async with SandboxPool(ledger).hosting(registration, ttl_s=host_ttl_s, kind_secret=key):
                yield registration
    finally:
        await world.close()
