"""The `minecraft` sandbox kind: one Minecraft world per sandbox, one bot per seat.

Contract:
- `MinecraftWorld(workdir, seats, isolation=)` installs the pinned server and bots on first use
  (rollout.sandbox.minecraft.install) and runs nothing until a claim opens: every `reset()` (a new claim
  epoch) stops the last world and starts a fresh one, a flying-squid server on 127.0.0.1 in offline mode with
  a generated flat world, and a bot per seat named `BOT_NAMES[seat]` (rollout.sandbox.minecraft.sidecar).
- The world runs jailed (`jailed`; isolation `bwrap`, rollout.sandbox.jail, within `MINECRAFT_LIMITS`): Node
  and the installed packages are read-only, the server's port is on the jail's own loopback, and a Unix socket
  in the jail's workspace is the one way in: what a model's chat or op might make the server do stays in the
  jail. `workdir/world.pid` names the process whose end is the world's.
- `act(seat, {"op": OP, ...arguments})` drives the seat's bot. The ops agents use: `observe`, `wait
  {seconds}`, `move_to {x, z}`, `look {x, y, z}`, `dig {x, y, z}`, `place {x, y, z, block?}`, `chat {text}`;
  the ops tasks use to set up and score: `setup {blocks?, start?, items?}` and `blocks {cells}`. Coordinates
  are block coordinates; answers are JSON (rollout.sandbox.minecraft.tools renders them as text for a model).
  An op the world refuses (too far, nothing to dig, no block in hand) raises `ValueError` with the reason.
- When the world's process dies, `act` raises `SandboxWorldLost` until the next claim resets it.
"""

from rollout.sandbox.minecraft.world import BOT_NAMES, MinecraftWorld

__all__ = ["BOT_NAMES", "MinecraftWorld"]
