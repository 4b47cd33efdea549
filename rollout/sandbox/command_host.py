"""The `command` sandbox kind: a host for command seats (Claude Code, Codex, a script of yours), so that the
policy's own process tree runs on a machine of its own (the chart's command-host pods), away from the
runner's keys and the stack's services.

Contract:
- A claim's network is its seat's gateway and nothing else (`gateway`; any endpoint is refused with 400), and
  its limits are the claim's (`COMMAND_LIMITS` when it names none). A host serves its seats jailed with
  bubblewrap only (`SandboxSetupError` for isolation `none`: then it would protect nothing).
- `act(seat, order, gateway=)` runs one command seat's whole command and answers how it ended. The order is
  `{"program": str, "argv": [str], "env": {str: str}, "cwd": str, "timeout_s": number, "readable": [str],
  "packages": [str], "files": str}`: `files` is the workspace the runner's Task prepared
  (rollout.sandbox.archive, base64). It opens a seat jail (rollout.sandbox.seat_jail) for `program` (with the
  Python `packages` it names) that reaches only `gateway`'s own seat routes (`{base}/s/{token}`), unpacks
  `files` into its workspace (refused with 400 when unsafe or over `MAX_ARCHIVE_BYTES`), sets the seat's URL
  variables as the jail sees them (over any the order names), runs `argv` (`{workdir}` there becomes
  `/sandbox`) for at most `timeout_s` (≤ `MAX_TIMEOUT_S`), and answers `{"exit_code", "output" (its last
  `OUTPUT_TAIL_BYTES`), "truncated", "timed_out", "files"}`, `files` being the workspace as the command left
  it, packed the same way, or `""` with `"files_dropped": true` when it packs to more than
  `MAX_ARCHIVE_BYTES`. A program this host does not have is refused with 400; a host that cannot jail answers
  503 (`SandboxWorldLost`). When the act ends, nothing the command started runs any more and its workspace is
  gone.
- What an order names of this host is allowlisted: its `program` (as found on this host's PATH, links
  followed) and each `readable` path must be inside the system's folders (`SYSTEM`), `/opt`, this host's own
  Python install, or a folder of `readable_roots` (`sandbox.command_readable`), and never inside, nor above, a
  folder of `refused_roots` (the data directory: the host's keys), this user's private root (other seats'
  workspaces) or `workdir`. Anything else is refused with 400, naming the path and the setting: whoever holds
  a claim (a runner) cannot have a seat read the host's keys.
- `reset()` (a newer claim) kills every command still running; its act raises `CommandKilled`, as does one
  that had not started yet.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollout.sandbox.archive import MAX_ARCHIVE_BYTES, ArchiveTooLarge, pack, unpack
from rollout.sandbox.jail import INSIDE, CommandKilled, Isolation, JailUnavailable
from rollout.sandbox.limits import COMMAND_LIMITS
from rollout.sandbox.private_root import private_root
from rollout.sandbox.programs import SYSTEM, ProgramNotFound
from rollout.sandbox.seat_jail import seat_jail, seat_variables
from rollout.sandbox.world import JsonObject, SandboxSetupError, SandboxWorldLost
from rollout.security.isolation import JailLimits, SandboxNetwork

OUTPUT_TAIL_BYTES = 64 * 1024
MAX_TIMEOUT_S = 24 * 3600.0
_SEAT_URL = re.compile(r"^(https?://[A-Za-z0-9.:\[\]-]+)/s/([A-Za-z0-9_-]+)$")
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_DISTRIBUTION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a Python distribution's name


@dataclass(frozen=True)
class CommandOrder:
    """One command seat's command, as a runner sends it."""

    program: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    timeout_s: float
    readable: tuple[str, ...]
    packages: tuple[str, ...]
    files: bytes

    @classmethod
    def parse(cls, action: JsonObject) -> CommandOrder:
        """The order `action` says; ValueError naming what is malformed."""
        program, argv, env = action.get("program"), action.get("argv"), action.get("env", {})
        cwd, timeout, readable = action.get("cwd", ""), action.get("timeout_s"), action.get("readable", [])
        if not isinstance(program, str) or not program:
            raise ValueError("a command order names its `program`")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("a command order's `argv` is a non-empty list of strings")
        if not isinstance(env, dict) or len(env) > 256:
            raise ValueError("a command order's `env` is an object of at most 256 variables")
        for name, value in env.items():
            if not _VARIABLE.match(name) or not isinstance(value, str):
                raise ValueError(f"environment variable {name!r} is not a plain name with a string value")
        if not isinstance(cwd, str):
            raise ValueError("a command order's `cwd` is a string")
        if (
            not isinstance(timeout, int | float)
            or isinstance(timeout, bool)
            or not 0 < timeout <= MAX_TIMEOUT_S
        ):
            raise ValueError(
                f"a command order's `timeout_s` is a number of seconds, at most {MAX_TIMEOUT_S:g}"
            )
        if not isinstance(readable, list) or not all(
            isinstance(r, str) and r.startswith("/") for r in readable
        ):
            raise ValueError("a command order's `readable` is a list of absolute paths")
        packages = action.get("packages", [])
        if not isinstance(packages, list) or not all(
            isinstance(p, str) and _DISTRIBUTION.match(p) for p in packages
        ):
            raise ValueError("a command order's `packages` is a list of Python distribution names")
        try:
            files = base64.b64decode(str(action.get("files", "")), validate=True)
        except (binascii.Error, ValueError) as error:
            raise ValueError("a command order's `files` is base64") from error
        if len(files) > MAX_ARCHIVE_BYTES:
            raise ValueError(f"a command order's `files` pack to more than {MAX_ARCHIVE_BYTES} bytes")
        return cls(
            program, tuple(argv), dict(env), cwd, float(timeout), tuple(readable), tuple(packages), files
        )


class CommandHost:
    runs_agent_commands = True
    serves_command_seats = True  # takes `readable_roots` and `refused_roots` (rollout.sandbox.hosting)

    def __init__(
        self,
        workdir: Path,
        seats: int,
        *,
        isolation: Isolation = Isolation.bwrap,
        readable_roots: Sequence[Path] = (),
        refused_roots: Sequence[Path] = (),
    ) -> None:
        if isolation is not Isolation.bwrap:
            raise SandboxSetupError(
                "a command host exists to jail the policy's commands away from the runner: serve it with "
                "sandbox.isolation=bwrap, where bubblewrap works"
            )
        own_python = (Path(sys.prefix), Path(sys.base_prefix))
        self.allowed = tuple(p.resolve() for p in (*SYSTEM, Path("/opt"), *own_python, *readable_roots))
        self.refused = tuple(p.resolve() for p in (*refused_roots, private_root(), workdir))
        self.seats = seats
        self.limits = COMMAND_LIMITS
        self._running: set[asyncio.Task[JsonObject]] = set()
        self._generation = 0  # bumped as a claim changes: an act that began before never starts its command

    async def configure(self, limits: JailLimits | None, network: SandboxNetwork) -> None:
        if network.endpoints or not network.gateway:
            raise ValueError(
                "a command host's claim reaches its seat's gateway and nothing else: network `gateway`"
            )
        self._generation += 1
        self.limits = limits or COMMAND_LIMITS

    async def reset(self) -> None:
        self._generation += 1
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def _check_reach(self, order: CommandOrder) -> None:
        """ValueError unless every path of this host the order names is one a seat may read."""
        named = list(order.readable)
        found = order.program if "/" in order.program else shutil.which(order.program)
        if found is not None:  # a program this host does not have is refused once the seat opens
            named.append(found)
        for path in named:
            resolved = Path(path).resolve()
            if any(resolved.is_relative_to(r) or r.is_relative_to(resolved) for r in self.refused) or not any(
                resolved.is_relative_to(root) for root in self.allowed
            ):
                raise ValueError(
                    f"this command host does not let a seat read {path}: a seat's program and readable paths "
                    f"are in {', '.join(map(str, self.allowed))}, never the host's data or other seats' folders; "
                    "add the folder to sandbox.command_readable where the host is served"
                )

    async def act(self, seat: int, action: JsonObject, *, gateway: str = "") -> JsonObject:
        order = CommandOrder.parse(action)
        self._check_reach(order)
        match = _SEAT_URL.match(gateway)
        if match is None:
            raise ValueError("a command seat's act names its gateway: `http://host:port/s/TOKEN`")
        generation = self._generation
        task = asyncio.create_task(self._run(order, match.group(1), match.group(2)))
        self._running.add(task)
        try:
            if generation != self._generation:
                task.cancel()
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:  # the request itself ended: so does its command
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise
        finally:
            self._running.discard(task)
        if task.cancelled():
            raise CommandKilled("the command was killed: its sandbox's claim ended")
        return task.result()

    async def _run(self, order: CommandOrder, base: str, token: str) -> JsonObject:
        try:
            return await self._run_jailed(order, base, token)
        except ProgramNotFound as error:
            raise ValueError(f"this command host cannot start {order.program!r}: {error}") from error
        except JailUnavailable as error:
            raise SandboxWorldLost(f"this command host cannot jail commands: {error}") from error

    async def _run_jailed(self, order: CommandOrder, base: str, token: str) -> JsonObject:
        async with seat_jail(
            order.program,
            gateway_url=base,
            token=token,
            isolation=Isolation.bwrap,
            readable=order.readable,
            packages=order.packages,
            limits=self.limits,
        ) as seat:
            unpack(order.files, seat.workdir, limit_bytes=min(MAX_ARCHIVE_BYTES, self.limits.disk_bytes))
            env = order.env | seat_variables(seat.base_url, token)
            argv = [part.replace("{workdir}", INSIDE) for part in order.argv]
            done = await seat.run(
                argv,
                env=env,
                cwd=order.cwd,
                timeout_s=order.timeout_s,
                max_output_bytes=OUTPUT_TAIL_BYTES,
                keep="tail",
            )
            result: JsonObject = {
                "exit_code": done.exit_code,
                "output": done.output,
                "truncated": done.truncated,
                "timed_out": done.timed_out,
            }
            try:
                packed = await asyncio.to_thread(pack, seat.workdir)
            except ArchiveTooLarge:
                return result | {"files": "", "files_dropped": True}
            return result | {"files": base64.b64encode(packed).decode()}

    async def close(self) -> None:
        await self.reset()
