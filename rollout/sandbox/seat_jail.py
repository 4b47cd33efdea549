"""A command seat's jail: where Claude Code, Codex or a user's script runs, and its one way out, to its own
seat.

Contract:
- `seat_jail(program, gateway_url=, token=, isolation=, readable=, packages=, limits=)` opens, for one
  command, a fresh workspace outside the data directory (`agent_workdir()`; a tmpfs of `limits.disk_bytes`
  when run by root) and a jail on it (rollout.sandbox.jail) whose root can read, besides the system's
  directories, the install of the command's `program` with the Python `packages` it runs on
  (rollout.sandbox.programs), the `readable` paths an environment declares, and nothing else of this
  machine. On leaving, every process of the jail is killed and the workspace removed.
- Isolation `bwrap`: the jail has no network but its own loopback, where the seat's gateway is at `base_url`
  (`http://127.0.0.1:PORT`): the jail's first process (rollout.sandbox.relay, rollout.sandbox.relay_folder)
  pumps that port to a Unix socket of the runner's (rollout.sandbox.seat_proxy) that forwards only the routes
  of the seat `token` names to `gateway_url`. Isolation `none` runs the command unjailed (a person chose it),
  and `base_url` is `gateway_url` itself.
- `seat_variables(base_url, token)` are the variables that point a command at its seat, in every dialect's
  spelling (OpenAI's, Anthropic's and rollout's own base URL and key).
- `SeatJail.run(argv, env=, cwd=, ...)` runs the command (its PATH: the programs' folders, then the system's),
  after `hand_over()` gave the jail's uid what this process wrote in the workspace; when it returns, nothing
  the command started runs any more. `workdir` is the workspace on this machine; `inside` is the same folder
  as the command sees it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rollout.config import SandboxIsolation as Isolation
from rollout.sandbox.jail import BASE_ENV, Jail, jail_uid
from rollout.sandbox.limits import COMMAND_LIMITS, JailLimits
from rollout.sandbox.private_root import private_root
from rollout.sandbox.programs import ProgramInstall, program_install
from rollout.sandbox.relay_folder import RelayFolder
from rollout.sandbox.seat_proxy import seat_proxy
from rollout.sandbox.workspace import Workspace
from rollout.security.bounded_process import ProcessOutcome

DEFAULT_PORT = 8080  # the gateway's port in the jail when its own is privileged (the jail has no capability)


def agent_workdir() -> Path:
    """A fresh folder for one command's workspace, outside the data directory."""
    return private_root() / "agents" / uuid.uuid4().hex[:16]


def inside_port(gateway_url: str) -> int:
    """The gateway's port on a jail's loopback: its own, unless that is privileged (the jail has no
    capability)."""
    port = urllib.parse.urlsplit(gateway_url).port
    return port if port is not None and port >= 1024 else DEFAULT_PORT


def seat_variables(base_url: str, token: str) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": f"{base_url}/s/{token}/v1",
        "OPENAI_API_KEY": token,
        "ANTHROPIC_BASE_URL": f"{base_url}/s/{token}",
        "ANTHROPIC_API_KEY": token,
        "ROLLOUT_BASE_URL": f"{base_url}/s/{token}/v1",
        "ROLLOUT_API_KEY": token,
    }


@dataclass
class SeatJail:
    jail: Jail
    install: ProgramInstall
    base_url: str  # the seat's gateway, as the command reaches it
    relay_argv: tuple[str, ...]  # what runs the command inside (empty: it runs as it is)

    @property
    def workdir(self) -> Path:
        return self.jail.workspace.path

    @property
    def inside(self) -> str:
        return self.jail.inside

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        timeout_s: float,
        max_output_bytes: int,
        keep: Literal["head", "tail"] = "tail",
    ) -> ProcessOutcome:
        self.jail.workspace.hand_over()
        search = ":".join([*map(str, self.install.bin_dirs), BASE_ENV["PATH"]])
        try:
            return await self.jail.run(
                [*self.relay_argv, *argv],
                env={**env, "PATH": search},
                cwd=cwd,
                timeout_s=timeout_s,
                max_output_bytes=max_output_bytes,
                keep=keep,
            )
        finally:
            await self.jail.kill_all()  # what it left running (isolation none: nothing ends it otherwise)


@contextlib.asynccontextmanager
async def seat_jail(
    program: str,
    *,
    gateway_url: str,
    token: str,
    isolation: Isolation,
    readable: Sequence[str | Path] = (),
    packages: Sequence[str] = (),
    limits: JailLimits = COMMAND_LIMITS,
    search_path: str | None = None,
) -> AsyncIterator[SeatJail]:
    install = program_install(program, search_path or os.environ.get("PATH", BASE_ENV["PATH"]), packages)
    folder = agent_workdir()
    bwrap = isolation is Isolation.bwrap
    relays = RelayFolder.create(folder.with_name(f"{folder.name}-relay")) if bwrap else None
    paths: list[Path] = [*install.readable, *map(Path, readable)]
    masked: list[Path] = list(install.masked)
    relay_argv: tuple[str, ...] = ()
    base_url = gateway_url.rstrip("/")
    if relays is not None:
        paths += relays.readable
        masked += relays.masked
        port = inside_port(gateway_url)
        relay_argv = relays.argv([(port, "gateway.sock")])
        base_url = f"http://127.0.0.1:{port}"
    workspace = Workspace(folder, disk_bytes=limits.disk_bytes, owner=jail_uid())
    try:
        jail = Jail(workspace, limits=limits, readable=paths, masked=masked, isolation=isolation)
        try:
            async with contextlib.AsyncExitStack() as stack:
                if relays is not None:
                    await stack.enter_async_context(
                        seat_proxy(relays.socket("gateway.sock"), gateway_url, f"/s/{token}/", owner=jail.uid)
                    )
                yield SeatJail(jail, install, base_url, relay_argv)
        finally:
            await jail.close()
    finally:
        workspace.clear()
        workspace.close()
        shutil.rmtree(folder, ignore_errors=True)
        if relays is not None:
            relays.remove()
