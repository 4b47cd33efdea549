"""`MinecraftWorld`: the sandbox-kind side of a Minecraft world (see the package's contract)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollout.sandbox.jail import BASE_ENV, Jail, jail_uid
from rollout.sandbox.minecraft.install import HERE, Installation, ensure_installed, minecraft_home
from rollout.sandbox.minecraft.sidecar import Sidecar, WorldLost
from rollout.sandbox.programs import program_install
from rollout.sandbox.workspace import Workspace
from rollout.sandbox.world import JsonObject
from rollout.security.isolation import GiB, JailLimits, MiB, SandboxIsolation

BOT_NAMES = ("Alex", "Blake", "Casey", "Drew", "Emery", "Finley", "Gray", "Harper")
AGENT_OPS = frozenset({"observe", "wait", "move_to", "look", "dig", "place", "chat"})
TASK_OPS = frozenset({"setup", "blocks"})
# A Node server and its bots for as long as a claim lasts: V8 reserves address space, and CPU time adds up.
MINECRAFT_LIMITS = JailLimits(
    processes=256,
    memory_bytes=3 * GiB,
    address_space_bytes=64 * GiB,
    cpu_s=7 * 24 * 3600,
    disk_bytes=256 * MiB,
)


def bot_name(seat: int) -> str:
    return BOT_NAMES[seat] if seat < len(BOT_NAMES) else f"Bot{seat}"


class MinecraftWorld:
    jailed = True  # the world's Node process runs in a jail of its own (rollout.sandbox.jail)

    def __init__(
        self,
        workdir: Path,
        seats: int,
        *,
        home: Path | None = None,
        isolation: SandboxIsolation = SandboxIsolation.bwrap,
    ) -> None:
        self.workdir = workdir
        self.seats = seats
        self.installation: Installation = ensure_installed(home or minecraft_home())
        node = program_install(str(self.installation.node), BASE_ENV["PATH"])
        # What the world reads, read-only: Node, the pinned packages, and the sidecar's own script.
        readable = [*node.readable, self.installation.home, HERE]
        self.workspace = Workspace(workdir, disk_bytes=MINECRAFT_LIMITS.disk_bytes, owner=jail_uid())
        self.jail = Jail(self.workspace, limits=MINECRAFT_LIMITS, readable=readable, isolation=isolation)
        self.sidecar: Sidecar | None = None
        self._lost: str | None = None
        self._changing = asyncio.Lock()

    @property
    def names(self) -> list[str]:
        return [bot_name(seat) for seat in range(self.seats)]

    async def reset(self) -> None:
        async with self._changing:
            if self.sidecar is not None:
                await self.sidecar.close()
                self.sidecar = None
            await self.jail.kill_all()
            await asyncio.to_thread(self.workspace.clear)
            try:
                self.sidecar = await Sidecar.start(self.installation, self.names, self.jail)
            except WorldLost as error:
                self._lost = str(error)
                raise
            self._lost = None
            # Beside the workspace (the jail's), for whoever must find the world's process: a test, an
            # operator.
            await asyncio.to_thread((self.workdir / "world.pid").write_text, str(self.sidecar.pid))

    async def act(self, seat: int, action: JsonObject) -> JsonObject:
        op = action.get("op")
        if op not in AGENT_OPS | TASK_OPS:
            raise ValueError(f"op must be one of {', '.join(sorted(AGENT_OPS | TASK_OPS))}, not {op!r}")
        if self.sidecar is None:
            raise WorldLost(self._lost or "no world is up: open a claim first")
        arguments: dict[str, Any] = {k: v for k, v in action.items() if k != "op"}
        result = await self.sidecar.request(seat, op, arguments)
        return result if isinstance(result, dict) else {"result": result}

    async def close(self) -> None:
        async with self._changing:
            if self.sidecar is not None:
                await self.sidecar.close()
                self.sidecar = None
            await self.jail.close()
            self.workspace.close()
