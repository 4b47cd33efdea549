"""An environment's `SandboxSpec.limits` and `SandboxSpec.network`, through a real sandbox server's `/open`: a
claim's commands get that environment's limits and reach exactly what it declared (a `host:port`, its own
seat's gateway routes) and nothing else; the next claim without them is back to none; a network naming the
stack's own service is refused; an act that waited through the next claim's reset never starts its command."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollout.environment import SandboxSpec
from rollout.net import free_port, serving
from rollout.sandbox import shell
from rollout.sandbox.client import SandboxActionError, SandboxClient
from rollout.sandbox.jail import CommandKilled
from rollout.sandbox.keys import kind_key
from rollout.sandbox.server import build_sandbox_app
from rollout.sandbox.shell import ShellWorld
from rollout.security.isolation import Endpoint, JailLimits, MiB, SandboxNetwork
from tests.sandboxutil import SANDBOX_KEY, claimed_seat

FETCH = """import os, sys, urllib.request, urllib.error
url = sys.argv[1].replace("GATEWAY", os.environ.get("ROLLOUT_GATEWAY_URL", "http://127.0.0.1:1"))
try:
    print(urllib.request.urlopen(url, timeout=5).read().decode())
except urllib.error.HTTPError as error:
    print(error.code, error.read().decode())
except OSError as error:
    print("unreachable", error)
"""


# Finds its own gateway socket in its relay's command line, then tries the seat beside it.
SIBLING = (
    "own=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -m1 'gateway-0.sock'); echo own=$own; "
    "other=${own%gateway-0.sock}gateway-1.sock; python3 -c 'import socket, sys; "
    's = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("connected")\' "$other"'
)


def _fetch(url: str) -> str:
    return f"python3 -c {shlex.quote(FETCH)} {shlex.quote(url)}"


def _connect(port: int) -> str:
    return f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo ping >&3 && head -n1 <&3"


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"echo " + await reader.readline())
    await writer.drain()
    writer.close()


def _gateway() -> Starlette:
    async def answer(request: Request) -> JSONResponse:
        return JSONResponse({"path": request.url.path})

    return Starlette(routes=[Route("/{path:path}", answer)])


def test_a_bad_network_fails_where_the_environment_is_defined() -> None:
    for wrong in (
        "everything",
        ("gateway", "db:99999"),
        ("db:80",),
        ("a:2000", "b:2000"),
        ("http://x:2000",),
    ):
        with pytest.raises(ValueError, match="network"):
            SandboxSpec("shell", network=wrong)
    spec = SandboxSpec("shell", network=("gateway", "DB.local:5432"))
    assert spec.access.gateway and spec.access.entries() == ["gateway", "db.local:5432"]


async def test_a_claim_gets_its_environments_limits_and_reaches_only_what_it_declared(tmp_path: Path) -> None:
    world = ShellWorld(tmp_path / "box", seats=2)
    ledger_port = free_port()
    app = build_sandbox_app(
        world,
        kind="shell",
        name="net",
        seats=2,
        key=kind_key(SANDBOX_KEY, "shell"),
        refused_endpoints=frozenset({Endpoint("127.0.0.1", ledger_port)}),
    )
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    echo_port = echo.sockets[0].getsockname()[1]
    closed_port = free_port()  # nothing listens: not declared, not reachable either way
    small = JailLimits(file_bytes=1 * MiB, processes=64)
    try:
        async with serving(app) as url, serving(_gateway()) as gateway:
            first = [
                replace(
                    claimed_seat(url, "shell", "net", epoch=1, seat=seat, holder="first"),
                    gateway_url=f"{gateway}/s/seat-{seat}",
                )
                for seat in (0, 1)
            ]
            async with SandboxClient(first[0]) as zero, SandboxClient(first[1]) as one:
                for alias in ("localhost", "127.0.1.1", "2130706433", "0", socket.gethostname()):
                    with pytest.raises(SandboxActionError, match="stack's own services"):
                        await zero.open(network=[f"{alias}:{ledger_port}"])
                await zero.open(limits=small.as_json(), network=["gateway", f"127.0.0.1:{echo_port}"])

                limits = await zero.act({"command": "ulimit -f; head -c 2M /dev/zero > big; echo $?"})
                assert limits["output"].split()[0] == "1024", "the environment's file size limit, in KiB"
                assert limits["output"].split()[-1] != "0", "a file over it cannot be written"
                reached = await zero.act({"command": _connect(echo_port)})
                assert reached["output"] == "echo ping\n", "the declared host:port is on the jail's loopback"
                assert (await zero.act({"command": _connect(closed_port)}))["exit_code"] != 0
                own = await zero.act({"command": _fetch("GATEWAY/v1/models")})
                assert '"/s/seat-0/v1/models"' in own["output"], own
                other = await one.act({"command": _fetch("GATEWAY/v1/models")})
                assert '"/s/seat-1/v1/models"' in other["output"], "each seat reaches its own routes"
                # Seat 1's proxy socket is beside seat 0's on this machine: seat 0's jail holds only its own.
                sibling = await zero.act({"command": SIBLING})
                assert "own=/" in sibling["output"] and "connected" not in sibling["output"], sibling
                escape = await zero.act({"command": _fetch("GATEWAY/../../operator/seats")})
                assert escape["output"].startswith("403"), escape
                gateway_port = int(gateway.rsplit(":", 1)[1])
                operator = await zero.act(
                    {"command": _fetch(f"http://127.0.0.1:{gateway_port}/operator/seats")}
                )
                assert operator["output"].startswith("403") or "unreachable" in operator["output"], operator

            second = claimed_seat(url, "shell", "net", epoch=2, seat=0, holder="second")
            async with SandboxClient(second) as later:
                await later.open()
                assert (await later.act({"command": _connect(echo_port)}))["exit_code"] != 0, (
                    "a claim that declares no network reaches nothing"
                )
                default = await later.act({"command": "ulimit -f"})
                assert default["output"].strip() == str(JailLimits().file_bytes // 1024)
    finally:
        echo.close()
        with contextlib.suppress(Exception):
            await echo.wait_closed()
        await world.close()


async def test_an_act_that_waited_through_a_reset_never_starts_its_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = ShellWorld(tmp_path / "box", seats=1)
    await world.configure(None, SandboxNetwork(gateway=True))
    entered, released = asyncio.Event(), asyncio.Event()

    real_proxy = shell.seat_proxy

    @contextlib.asynccontextmanager
    async def slow_proxy(*args: Any, **kwargs: Any) -> AsyncIterator[None]:
        entered.set()  # the act is inside its set-up, past the server's epoch check
        await released.wait()
        async with real_proxy(*args, **kwargs):
            yield

    monkeypatch.setattr(shell, "seat_proxy", slow_proxy)
    try:
        acting = asyncio.create_task(
            world.act(0, {"command": "touch left-by-the-old-claim"}, gateway="http://127.0.0.1:9/s/tok")
        )
        await asyncio.wait_for(entered.wait(), 10)
        await world.reset()  # the next claim's: it kills what runs, and clears the folder
        released.set()
        with pytest.raises(CommandKilled):
            await acting
        assert list(world.workdir.iterdir()) == [], "nothing of the old claim's act ran in the next claim"
    finally:
        released.set()
        await world.close()
