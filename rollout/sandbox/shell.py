"""The `shell` sandbox kind: a computer, i.e. a working directory and a process runner that agents drive.

Contract:
- Every seat shares one working directory, the jail's workspace (rollout.sandbox.jail: the only place a
  command may write, at `/sandbox` inside; a tmpfs of `limits.disk_bytes` when run by root). `reset()` kills
  every command still running (and all they started) and empties it: a claim starts from a clean directory,
  alone.
- `act(seat, {"command": str, "timeout_s"?: float})` runs the command with `bash -c` in its own jail and
  answers `{"exit_code", "output", "truncated", "timed_out"}`. stdout and stderr are merged in order. A
  command killed by `reset()` (its claim was superseded) raises `CommandKilled`, and so does an act whose
  command had not started when the next claim's `configure()` or `reset()` began: it never starts.
- Limits: a command runs at most `timeout_s` (default `DEFAULT_TIMEOUT_S`, capped at `MAX_TIMEOUT_S`); then
  its whole tree is killed, `timed_out` is true and `exit_code` is null. Output beyond `MAX_OUTPUT_BYTES` is
  dropped (the command keeps running to its end) and `truncated` is true. What it may use is `limits`
  (`SHELL_LIMITS`).
- `configure(limits, network)` (before a claim's `reset()`; the sandbox server calls it with the claim's
  environment's `SandboxSpec`) sets what that claim's commands may use (`limits`, the kind's own when None)
  and reach (rollout.security.isolation.SandboxNetwork; nothing by default). Each endpoint `host:port` is at
  `127.0.0.1:port` in the jail (rollout.sandbox.endpoint_bridge); with `gateway`, an act that names its seat's
  gateway (`{base}/s/{token}`) reaches that seat's routes and no other's (rollout.sandbox.seat_proxy), at the
  URL the command finds in `ROLLOUT_GATEWAY_URL` (`OPENAI_BASE_URL` is its `/v1`).
- `SHELL_TOOL` is the tool an agent drives it with; `shell_result_text` renders a result for the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

from rollout.contracts import ToolSpec
from rollout.sandbox.endpoint_bridge import endpoint_bridge
from rollout.sandbox.jail import CommandKilled, Isolation, Jail, jail_uid
from rollout.sandbox.limits import SHELL_LIMITS
from rollout.sandbox.relay_folder import RelayFolder
from rollout.sandbox.seat_jail import inside_port
from rollout.sandbox.seat_proxy import seat_proxy
from rollout.sandbox.workspace import Workspace
from rollout.sandbox.world import JsonObject, SandboxWorldLost
from rollout.security.isolation import JailLimits, SandboxNetwork

DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 120.0
MAX_OUTPUT_BYTES = 16 * 1024
_SEAT_URL = re.compile(r"^(http://[A-Za-z0-9.:\[\]-]+)/s/([A-Za-z0-9_-]+)$")

SHELL_TOOL = ToolSpec(
    name="shell",
    description="Run a bash command in the sandbox's working directory; answers its exit code and output.",
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "the bash command line"},
            "timeout_s": {
                "type": "number",
                "description": f"seconds before it is killed (≤ {MAX_TIMEOUT_S:g})",
            },
        },
        "required": ["command"],
    },
)


def shell_result_text(result: JsonObject) -> str:
    notes = []
    if result.get("timed_out"):
        notes.append("[killed: time limit]")
    if result.get("truncated"):
        notes.append("[output truncated]")
    return f"exit code {result['exit_code']}\n{result['output']}{' '.join(notes)}"


class ShellWorld:
    runs_agent_commands = True

    def __init__(
        self,
        workdir: Path,
        seats: int,
        *,
        isolation: Isolation = Isolation.bwrap,
        limits: JailLimits = SHELL_LIMITS,
    ) -> None:
        self.seats = seats
        self.kind_limits = limits
        self.network = SandboxNetwork()
        self.workspace = Workspace(workdir, disk_bytes=limits.disk_bytes, owner=jail_uid())
        self.jail = Jail(self.workspace, limits=limits, isolation=isolation)
        self._relays: RelayFolder | None = None
        # The endpoints' bridges, for as long as the network holds.
        self._bridges = contextlib.AsyncExitStack()
        self._gateways: dict[int, tuple[str, contextlib.AsyncExitStack]] = {}  # seat: its proxy, one claim's
        self._gateway_locks: dict[int, asyncio.Lock] = {}
        # Bumped as a claim changes: an act that began before must not start a command after the reset's kill.
        self._generation = 0

    @property
    def workdir(self) -> Path:
        return self.workspace.path

    async def configure(self, limits: JailLimits | None, network: SandboxNetwork) -> None:
        """What the next claim's commands may use and reach (its environment's `SandboxSpec`; the kind's own
        limits when None). Called before that claim's `reset()`."""
        self._generation += 1
        limits = limits or self.kind_limits
        if limits == self.jail.limits and network == self.network:
            return
        isolation = self.jail.isolation
        await self.jail.close()
        await self._close_network()
        try:
            self.workspace.disk_bytes = limits.disk_bytes  # the reset's fresh tmpfs has the new size
            self.network = network
            readable: tuple[Path, ...] = ()
            masked: tuple[Path, ...] = ()
            if isolation is Isolation.bwrap and not network.none:
                self._relays = RelayFolder.create(
                    self.workspace.path.with_name(f"{self.workspace.path.name}-relay")
                )
                # each command binds its own sockets, no other seat's
                readable, masked = self._relays.interpreter.readable, self._relays.masked
                for endpoint in network.endpoints:
                    socket = self._relays.socket(f"port-{endpoint.port}.sock")
                    bridge = endpoint_bridge(socket, endpoint, owner=jail_uid())
                    await self._bridges.enter_async_context(bridge)
            self.jail = Jail(
                self.workspace, limits=limits, readable=readable, masked=masked, isolation=isolation
            )
        except Exception as error:  # back to the kind's own jail, whole: the claim does not open
            await self._close_network()
            self.network = SandboxNetwork()
            self.workspace.disk_bytes = self.kind_limits.disk_bytes
            self.jail = Jail(self.workspace, limits=self.kind_limits, isolation=isolation)
            raise SandboxWorldLost(f"the claim's jail could not be set up: {error}") from error

    async def reset(self) -> None:
        self._generation += 1
        await self.jail.kill_all()
        await self._close_gateways()
        self.workspace.clear()

    async def _close_gateways(self) -> None:
        proxies = list(self._gateways.values())
        self._gateways.clear()
        for _, proxy in proxies:
            await proxy.aclose()

    async def _reach_gateway(self, seat: int, gateway: str) -> tuple[int, dict[str, str]]:
        """The inside port of `seat`'s own gateway routes (`gateway`: `{base}/s/{token}`) and its
        variables."""
        match = _SEAT_URL.match(gateway)
        if match is None:
            raise ValueError("a seat's gateway is `http://host:port/s/TOKEN`")
        base, token = match.group(1), match.group(2)
        if self._relays is None:  # unjailed: the command reaches the gateway itself
            port, url = 0, gateway
        else:
            port = inside_port(base)
            while port in {endpoint.port for endpoint in self.network.endpoints}:
                port += 1  # the gateway's port in the jail is the environment's endpoint: use the next one
            async with self._gateway_locks.setdefault(seat, asyncio.Lock()):
                held = self._gateways.get(seat)
                if held is None or held[0] != gateway:
                    if held is not None:  # the seat's gateway changed: the old one's proxy goes
                        del self._gateways[seat]
                        await held[1].aclose()
                    proxy = contextlib.AsyncExitStack()
                    socket = self._relays.socket(f"gateway-{seat}.sock")
                    await proxy.enter_async_context(
                        seat_proxy(socket, base, f"/s/{token}/", owner=jail_uid())
                    )
                    self._gateways[seat] = (gateway, proxy)
            url = f"http://127.0.0.1:{port}/s/{token}"
        return port, {"ROLLOUT_GATEWAY_URL": url, "OPENAI_BASE_URL": f"{url}/v1"}

    async def act(self, seat: int, action: JsonObject, *, gateway: str = "") -> JsonObject:
        command = action.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ValueError("a shell action needs a non-empty 'command' string")
        timeout = action.get("timeout_s")
        if timeout is not None and (
            not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0
        ):
            raise ValueError(f"'timeout_s' must be a positive number of seconds (at most {MAX_TIMEOUT_S:g})")
        timeout_s = min(float(timeout or DEFAULT_TIMEOUT_S), MAX_TIMEOUT_S)
        generation = self._generation
        env = {"ROLLOUT_SANDBOX_SEAT": str(seat)}
        pairs = [(e.port, f"port-{e.port}.sock") for e in self.network.endpoints]
        if self.network.gateway and gateway:
            port, variables = await self._reach_gateway(seat, gateway)
            env |= variables
            if port:
                pairs.append((port, f"gateway-{seat}.sock"))
        relays = self._relays
        # The claim changed while this act waited: its command never starts.
        if generation != self._generation:
            raise CommandKilled("the command was not started: its sandbox's claim ended")
        done = await self.jail.run(
            [*(relays.argv(pairs) if relays else ()), "bash", "-c", command],
            timeout_s=timeout_s,
            max_output_bytes=MAX_OUTPUT_BYTES,
            env=env,
            binds=relays.binds(pairs) if relays else (),
        )
        return {
            "exit_code": done.exit_code,
            "output": done.output,
            "truncated": done.truncated,
            "timed_out": done.timed_out,
        }

    async def _close_network(self) -> None:
        await self._close_gateways()
        await self._bridges.aclose()
        if self._relays is not None:
            self._relays.remove()
            self._relays = None

    async def close(self) -> None:
        await self.jail.close()
        await self._close_network()
        self.workspace.close()
