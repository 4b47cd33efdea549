"""What a sandbox kind implements: a world with seats, reset for each claim, acted on by seat.

Contract:
- A kind is a factory `(workdir, seats) -> SandboxWorld`. A kind that runs anything in a jail
  (rollout.sandbox.jail) says so (`jailed = True`, `jailed(factory)`) and takes `isolation=` too; one that
  runs the commands agents choose says that as well (`runs_agent_commands = True`: it is configured per claim,
  see rollout.sandbox.server). `shell`, `minecraft` and `command` (a host for command seats) are built in;
  any other kind is named by a reference `package.module:attribute` (an environment ships its own kind, e.g.
  `gridworld.shared:grid`). A `#suffix`
  names a separate pool of the same world (`shell#big-disk`): the suffix plays no part in loading.
- `reset()` is called once per claim, before any seat acts: the next episode never sees the last one's state.
- `act(seat, action)` takes and returns JSON objects. Seats act concurrently; a world that has shared state
  keeps it consistent itself (the server does not serialise acts, so a long shell command blocks no one).
- A world owns whatever it runs (a server process of its own, say) and stops it in `close()`.
- A world whose state is gone for the current claim (its server process died) raises `SandboxWorldLost` from
  `act`; the claim's agents cannot go on in it, and the next claim's `reset()` brings a fresh world.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

from rollout.references import ReferenceLoadError, import_reference

JsonObject = dict[str, Any]


class SandboxWorld(Protocol):
    async def reset(self) -> None: ...

    async def act(self, seat: int, action: JsonObject) -> JsonObject: ...

    async def close(self) -> None: ...


SandboxKind = Callable[..., SandboxWorld]  # (workdir: Path, seats: int, *, isolation=...) -> world

BUILT_IN = {
    "shell": "rollout.sandbox.shell:ShellWorld",
    "minecraft": "rollout.sandbox.minecraft:MinecraftWorld",
    "command": "rollout.sandbox.command_host:CommandHost",
}


class UnknownSandboxKind(ValueError):
    pass


class SandboxSetupError(RuntimeError):
    """A kind could not set itself up on this machine (what it runs is missing and cannot be installed)."""


class SandboxWorldLost(RuntimeError):
    """The world is gone for the current claim: nothing more can be done in it until the next claim resets
    it."""


def jailed(factory: object) -> bool:
    """Whether a kind runs something in a jail, and so takes the host's `isolation=`."""
    return bool(getattr(factory, "jailed", False) or getattr(factory, "runs_agent_commands", False))


def load_kind(kind: str) -> SandboxKind:
    """The factory for `kind`: a built-in name (shell, minecraft, command) or `package.module:attribute`."""
    world = kind.partition("#")[0]
    reference = BUILT_IN.get(world, world)
    try:
        factory = import_reference(reference, "sandbox kind")
    except ReferenceLoadError as error:
        raise UnknownSandboxKind(
            f"sandbox kind {kind!r} is neither built in ({', '.join(BUILT_IN)}) nor loadable: {error}"
        ) from error
    if not callable(factory):
        raise UnknownSandboxKind(f"sandbox kind {kind!r} is not a factory (workdir, seats) -> world")
    return cast(SandboxKind, factory)
