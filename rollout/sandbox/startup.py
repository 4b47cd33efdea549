"""Sandboxes started from settings: what `rollout sandbox serve` (and the embedded stack, which runs that
command) hosts, `count` of one kind, each registered in its pool until stopped.

Contract:
- `SandboxAsked` is what the command line asked.
- `plan_sandboxes(settings, asked)` checks it and returns a `SandboxPlan`: at least one seat and one sandbox,
  no fixed port for several (`SandboxOptionError`, as for a kind that cannot be loaded); the kind's host key
  (made on a loopback host; beyond loopback it must be the runners' own, rollout.sandbox.keys:
  `SandboxKeyMissing` otherwise); a port (a free one for 0) that no other process holds (`SandboxPortTaken`).
  `jailed` says whether the kind runs anything in a jail, `installable` whether it installs what it runs
  first (rollout.sandbox.minecraft.install). Nothing is served yet.
- `hosted_sandboxes(plan, ledger, report)` serves and registers every sandbox of the plan (NAME, or NAME-0 …
  NAME-(N-1) on free ports of their own) with the settings' isolation, no network to the stack's own services
  and the command host's readable folders, reporting each; they leave their pool when the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rollout.config import Settings
from rollout.ledger import Ledger
from rollout.net import free_port, port_is_free
from rollout.sandbox.claims import SandboxRegistration
from rollout.sandbox.hosting import hosted_sandbox, sandbox_workdir, stack_endpoints
from rollout.sandbox.keys import load_host_key
from rollout.sandbox.world import UnknownSandboxKind, jailed, load_kind

INSTALLABLE = ("minecraft",)  # the kinds that install what they run on first use
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class SandboxOptionError(ValueError):
    """An option the sandboxes cannot be served with; the message says what to change."""


class SandboxPortTaken(RuntimeError):
    """The port a sandbox would listen on is held by another process."""


@dataclass(frozen=True)
class SandboxAsked:
    """What `rollout sandbox serve` was asked."""

    kind: str = "shell"
    """shell, minecraft, command, or package.module:attribute of an environment's kind."""
    name: str = "sandbox-0"
    """The sandbox's name in its pool (unique per kind); with `count` > 1, NAME-0 … NAME-(count-1)."""
    seats: int = 4
    """How many agents can play in each at once."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free one (always, with `count` > 1)."""
    count: int = 1


@dataclass(frozen=True)
class SandboxPlan:
    settings: Settings
    asked: SandboxAsked
    port: int
    jailed: bool
    key: bytes = field(repr=False)

    @property
    def installable(self) -> bool:
        return self.asked.kind.partition("#")[0] in INSTALLABLE

    @property
    def names(self) -> list[str]:
        asked = self.asked
        return [asked.name] if asked.count == 1 else [f"{asked.name}-{i}" for i in range(asked.count)]


def plan_sandboxes(settings: Settings, asked: SandboxAsked) -> SandboxPlan:
    if asked.seats < 1 or asked.count < 1:
        raise SandboxOptionError("--seats and --count must be at least 1")
    if asked.count > 1 and asked.port:
        raise SandboxOptionError("--count serves each sandbox on a free port of its own: leave out --port")
    try:
        factory = load_kind(asked.kind)
    except UnknownSandboxKind as error:
        raise SandboxOptionError(str(error)) from None
    # Beyond loopback the key must be the runners' own: a fresh one would authenticate no claim.
    key = load_host_key(settings.data_path, asked.kind, create=asked.host in LOOPBACK)
    port = asked.port or free_port()
    if not port_is_free(asked.host, port):
        raise SandboxPortTaken(
            f"port {port} on {asked.host} is taken: choose another with `--port PORT` (or 0 for a free one)"
        )
    return SandboxPlan(settings, asked, port, jailed(factory), key)


@asynccontextmanager
async def hosted_sandboxes(
    plan: SandboxPlan, ledger: Ledger, report: Callable[[str], None]
) -> AsyncIterator[list[SandboxRegistration]]:
    settings, asked = plan.settings, plan.asked
    async with contextlib.AsyncExitStack() as boxes:
        hosted = []
        for name in plan.names:
            box = await boxes.enter_async_context(
                hosted_sandbox(
                    ledger,
                    asked.kind,
                    name,
                    seats=asked.seats,
                    workdir=sandbox_workdir(settings.data_path, asked.kind, name),
                    key=plan.key,
                    host=asked.host,
                    port=plan.port if asked.count == 1 else free_port(),
                    isolation=settings.sandbox.isolation,
                    refused_endpoints=stack_endpoints(settings),
                    readable_roots=[Path(folder) for folder in settings.sandbox.command_readable],
                    refused_roots=[settings.data_path],
                )
            )
            report(
                f"sandbox {name!r} ({asked.kind}, {asked.seats} seats) on {box.address}, in the pool until stopped"
            )
            hosted.append(box)
        yield hosted
