"""Ports and in-process HTTP serving: a free port, whether a port is free, an ASGI app served for as long as a
block lasts (env check, sandboxes, tests, benchmarks). No service of rollout's own is started here."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (binding it briefly is the only reliable test)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def reachable_host(host: str) -> str:
    """The address others reach a server bound to `host` at: `host` itself, or for all interfaces (0.0.0.0,
    ::) this machine's own address (a pod's IP, a Ray node's)."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


PORT_SLICE_VARIABLE = "ROLLOUT_PORT_SLICE"
"""`K/N`: this process and its children pick ports only from the K-th of N equal slices of the range, so
that N process trees on one machine (parallel test workers) never pick a port another has picked and not yet
bound (a port is checked free when picked, and nothing holds it until its server binds)."""

_handed_out: set[int] = set()
_handing_out = threading.Lock()
_random = random.SystemRandom()  # not the global RNG: a test that seeds it must not make every pick the same


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for tests and benchmarks that start their own stack).

    Chosen outside the kernel's ephemeral range (below it, or above it where below is too narrow): a port from
    that range (what binding port 0 gives) can be taken as the local end of any outgoing connection between
    being picked here and being bound by the server it is for, or while that server restarts, and the server
    then fails with "address in use". A port is not handed out twice by one process (a stack's six ports are
    picked before any is bound)."""
    with _handing_out:
        if (span := _outside_ephemeral_range()) is not None:
            for _ in range(64):
                port = _random.randrange(*span)
                if port not in _handed_out and port_is_free(host, port):
                    _handed_out.add(port)
                    return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # crowded or no room: any free port
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        _handed_out.add(port)
        return port


def _outside_ephemeral_range(width: int = 12_000) -> tuple[int, int] | None:
    """Up to `width` unprivileged ports next to the ephemeral range outgoing connections use (Linux's default
    range where unreadable), as randrange's bounds; None where neither side has room."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    if low - 1024 >= 2_000:
        span = max(1024, low - width), low
    elif 65535 - high >= 2_000:
        span = high + 1, min(65536, high + 1 + width)
    else:
        return None
    return _this_slice(span, os.environ.get(PORT_SLICE_VARIABLE, ""))


def _this_slice(span: tuple[int, int], given: str) -> tuple[int, int]:
    """The K-th of N slices of `span` that PORT_SLICE_VARIABLE's `K/N` names; the whole span when unset or
    malformed (ports are still checked free, so a bad value costs only the slices' guarantee)."""
    try:
        index, count = map(int, given.split("/"))
    except ValueError:
        return span
    if not 0 <= index < count:
        return span
    width = (span[1] - span[0]) // count
    return span[0] + index * width, span[0] + (index + 1) * width


SHUTDOWN_GRACE_S = 5


@asynccontextmanager
async def serving(app: ASGIApp, host: str = "127.0.0.1", port: int | None = None) -> AsyncIterator[str]:
    """Serve `app` on `port` (a free one by default); yields its base URL once it accepts connections. On the
    way out, requests still in flight get `SHUTDOWN_GRACE_S` to finish, then are cancelled (a request held
    waiting, such as a turn of a paused run, would otherwise hold the server up for as long as it waits)."""
    port = port or free_port()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(1000):  # up to 20 s
        if server.started or task.done():
            break
        await asyncio.sleep(0.02)
    if not server.started:
        server.should_exit = True
        await task
        raise RuntimeError(f"could not serve on {host}:{port}")
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await task
