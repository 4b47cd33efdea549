"""The Python end of one world's Node sidecar (`sidecar.mjs`: a flying-squid server and one bot per seat).

Contract:
- `Sidecar.start(installation, names, jail)` starts the Node process in `jail` (rollout.sandbox.jail:
  read-only packages, no network but its own loopback, where the server listens and the bots join it), its log
  in the jail's workspace (`world.log`), and connects to it over a Unix socket in that workspace, the world's
  only way in or out. It returns once every bot has spawned (`ready`: how long the server took to listen and
  the bots to join, the ground's height). `pid` is the process whose end is the world's (the jail's);
  `world_pid()` is the Node process itself, on this machine. A world that is not up within `READY_TIMEOUT_S`
  is stopped and `WorldLost` raised with the tail of its log; a start that fails or is cancelled leaves no
  process or socket behind.
- `request(seat, op, args)` sends one request and answers its result; requests from many seats are in flight
  at once. An op the world refuses raises `ValueError` with the world's reason, and so does one it does not
  answer within `REQUEST_TIMEOUT_S` (the world goes on).
- The world is lost when its process ends or its socket closes (it was killed, it crashed): every pending and
  later request raises `WorldLost`. Nothing restarts it: the owner starts a new one (a new claim, a new
  world).
- `close()` kills the jail's process and removes the socket; the sidecar also exits by itself when its socket
  closes, so a world never outlives the process that owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.net import free_port
from rollout.sandbox.jail import Jail
from rollout.sandbox.minecraft.install import Installation
from rollout.sandbox.world import SandboxWorldLost

READY_TIMEOUT_S = 90.0
REQUEST_TIMEOUT_S = 120.0


class WorldLost(SandboxWorldLost):
    """The world's process is gone: this world answers nothing more."""


@dataclass(frozen=True)
class Ready:
    listening_ms: float
    ready_ms: float
    ground_y: int


class Sidecar:
    def __init__(
        self,
        process: subprocess.Popen[bytes],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        socket_dir: Path,
        log: Path,
    ) -> None:
        self.process = process
        self._reader = reader
        self._writer = writer
        self._socket_dir = socket_dir
        self.log = log
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._lost: str | None = None
        self._listening: asyncio.Task[None] | None = None
        self.ready: Ready | None = None

    @classmethod
    async def start(cls, installation: Installation, names: list[str], jail: Jail) -> Sidecar:
        deadline = time.monotonic() + READY_TIMEOUT_S
        workspace = jail.workspace.path
        socket_dir = await asyncio.to_thread(_short_way_to, workspace)
        # Relative to the jail's working directory: the same file, whichever path each side knows it by.
        config = {"home": str(installation.home), "port": free_port(), "names": names, "socket": "world.sock"}
        log = workspace / "world.log"
        process: subprocess.Popen[bytes] | None = None
        writer: asyncio.StreamWriter | None = None
        try:
            command = [str(installation.node), str(installation.sidecar), json.dumps(config)]
            process = jail.spawn(["/bin/sh", "-c", 'exec "$0" "$@" </dev/null >>world.log 2>&1', *command])
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()
            reader, writer = await cls._connect(process, socket_dir / "world" / "world.sock", deadline)
            line = await asyncio.wait_for(reader.readline(), max(deadline - time.monotonic(), 0.1))
            answer = json.loads(line) if line else {}
            if not isinstance(answer, dict) or not answer.get("ready"):
                raise WorldLost(f"the Minecraft world did not come up: {_tail(log)}")
            ready = Ready(float(answer["listening_ms"]), float(answer["ready_ms"]), int(answer["ground_y"]))
        except BaseException as error:  # cancelled too: never leave a world running that nobody owns
            if writer is not None:
                writer.close()
            if process is not None:
                _kill(process)
            shutil.rmtree(socket_dir, ignore_errors=True)
            if isinstance(error, WorldLost) or not isinstance(error, Exception):
                raise
            raise WorldLost(f"the Minecraft world did not come up ({error!r}): {_tail(log)}") from error
        sidecar = cls(process, reader, writer, socket_dir, log)
        sidecar.ready = ready
        sidecar._listening = asyncio.create_task(sidecar._listen())
        return sidecar

    @staticmethod
    async def _connect(
        process: subprocess.Popen[bytes], socket: Path, deadline: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while True:
            if process.poll() is not None:
                raise WorldLost(f"the Minecraft world exited with {process.returncode} before it listened")
            with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
                return await asyncio.open_unix_connection(str(socket), limit=16 * 1024 * 1024)
            if time.monotonic() > deadline:
                raise TimeoutError("the world's socket never appeared")
            await asyncio.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.process.pid

    def world_pid(self) -> int:
        """The Node process on this machine (in its jail, a child of the jail's own processes)."""
        return _node_in(self.process.pid)

    @property
    def lost(self) -> str | None:
        return self._lost

    async def _listen(self) -> None:
        try:
            while line := await self._reader.readline():
                answer = json.loads(line)
                future = self._pending.pop(answer.get("id"), None)
                if future is None or future.done():
                    continue
                if answer.get("ok"):
                    future.set_result(answer.get("result"))
                else:
                    future.set_exception(ValueError(str(answer.get("error", "the world refused"))))
        except Exception as error:  # a broken connection or a garbled line: nothing more can be trusted
            self._lose(f"its connection broke ({error!r})")
            return
        self._lose("its connection closed (its process ended)")

    def _lose(self, why: str) -> None:
        if self._lost is None:
            self._lost = f"the Minecraft world is lost: {why}"
        for future in self._pending.values():
            if not future.done():
                future.set_exception(WorldLost(self._lost))
        self._pending.clear()

    async def request(self, seat: int, op: str, args: dict[str, Any]) -> Any:
        if self._lost is not None:
            raise WorldLost(self._lost)
        key = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            self._writer.write(json.dumps({"id": key, "seat": seat, "op": op, "args": args}).encode() + b"\n")
            await self._writer.drain()
        except OSError as error:
            self._pending.pop(key, None)
            self._lose(f"writing to it failed ({error})")
            raise WorldLost(self._lost or "the Minecraft world is lost") from error
        try:
            return await asyncio.wait_for(future, REQUEST_TIMEOUT_S)
        except TimeoutError as error:  # one slow action: the world may still answer the others
            raise ValueError(f"the world did not answer {op} within {REQUEST_TIMEOUT_S:g}s") from error
        finally:
            self._pending.pop(key, None)

    async def close(self) -> None:
        self._lose("it was closed")
        if self._listening is not None:
            self._listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listening
        with contextlib.suppress(OSError):
            self._writer.close()
        _kill(self.process)
        await asyncio.to_thread(self.process.wait)
        shutil.rmtree(self._socket_dir, ignore_errors=True)


def _short_way_to(workspace: Path) -> Path:
    """A folder with a short path whose `world` links to `workspace`: a socket's path has about 100 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="rollout-mc-"))
    (folder / "world").symlink_to(workspace)
    return folder


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        found.setdefault(parent, []).append(int(stat.parent.name))
    return found


def _node_in(pid: int) -> int:
    """The first `node` process of `pid`'s tree (`pid` itself when unjailed), else `pid`."""
    children, waiting = _children(), [pid]
    while waiting:
        each = waiting.pop(0)
        with contextlib.suppress(OSError):
            if Path(f"/proc/{each}/comm").read_text().strip() == "node":
                return each
        waiting += children.get(each, [])
    return pid


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _tail(log: Path) -> str:
    try:
        return " / ".join(log.read_text(errors="replace").strip().splitlines()[-5:]) or "(its log is empty)"
    except OSError:
        return "(no log)"
