"""`MinecraftWorld`: the sandbox-kind side of a Minecraft world (see the package's contract)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollout.sandbox.minecraft.install import Installation, ensure_installed, minecraft_home
from rollout.sandbox.minecraft.sidecar import Sidecar, WorldLost
from rollout.sandbox.world import JsonObject

BOT_NAMES = ("Alex", "Blake", "Casey", "Drew", "Emery", "Finley", "Gray", "Harper")
AGENT_OPS = frozenset({"observe", "wait", "move_to", "look", "dig", "place", "chat"})
TASK_OPS = frozenset({"setup", "blocks"})


def bot_name(seat: int) -> str:
    return BOT_NAMES[seat] if seat < len(BOT_NAMES) else f"Bot{seat}"


class MinecraftWorld:
    def __init__(self, workdir: Path, seats: int, *, home: Path | None = None) -> None:
        self.workdir = workdir
        self.seats = seats
        self.installation: Installation = ensure_installed(home or minecraft_home())
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
            try:
                self.sidecar = await Sidecar.start(self.installation, self.names, self.workdir)
            except WorldLost as error:
                self._lost = str(error)
                raise
            self._lost = None

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
