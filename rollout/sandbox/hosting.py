"""Host one sandbox: build its world, serve it over HTTP, and keep it in its pool for as long as the block runs.

`rollout sandbox serve` is this in a process of its own; env checks and tests use it in process. The world is
closed when hosting ends (a kind that runs a server process stops it there).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from rollout.ledger import Ledger
from rollout.net import serving
from rollout.sandbox.claims import SandboxPool, SandboxRegistration
from rollout.sandbox.server import build_sandbox_app
from rollout.sandbox.world import load_kind


def sandbox_workdir(data_path: Path, kind: str, name: str) -> Path:
    return data_path / "sandboxes" / kind.replace(":", "-").replace("/", "-") / name


@asynccontextmanager
async def hosted_sandbox(
    ledger: Ledger,
    kind: str,
    name: str,
    *,
    seats: int,
    workdir: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    host_ttl_s: float = 30,
) -> AsyncIterator[SandboxRegistration]:
    world = load_kind(kind)(workdir, seats)
    try:
        async with serving(build_sandbox_app(world, kind=kind, name=name, seats=seats), host, port) as url:
            registration = SandboxRegistration(kind=kind, name=name, address=url, seats=seats)
            async with SandboxPool(ledger).hosting(registration, ttl_s=host_ttl_s):
                yield registration
    finally:
        await world.close()
