"""A jail's way to one `host:port` an environment declared (`SandboxSpec.network`): a byte pump on a Unix
socket.

Contract:
- `endpoint_bridge(socket_path, endpoint, owner=)` serves the Unix socket `socket_path` (mode 0600, owned by
  `owner`, the jail's uid, when run by root) while the context is open: each connection is pumped both ways to
  a TCP connection to `endpoint`, opened for it; one that cannot be opened is closed at once. It reaches that
  endpoint and no other: the jail's relay (rollout.sandbox.relay) listens on the endpoint's port of the jail's
  loopback and pumps to this socket. Which endpoints a claim may name is the sandbox server's to check. On
  leaving, every connection still open is closed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

from rollout.security.isolation import Endpoint

CHUNK = 64 * 1024


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            if sink.can_write_eof():
                sink.write_eof()


@contextlib.asynccontextmanager
async def endpoint_bridge(socket_path: Path, endpoint: Endpoint, *, owner: int) -> AsyncIterator[None]:
    open_now: set[asyncio.Task[None]] = set()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (task := asyncio.current_task()) is not None:
            open_now.add(task)
            task.add_done_callback(open_now.discard)
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(endpoint.host, endpoint.port), timeout=30
            )
        except (OSError, TimeoutError):
            writer.close()
            return
        try:
            await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))
        finally:
            for each in (writer, upstream_writer):
                each.close()

    server = await asyncio.start_unix_server(connected, path=str(socket_path))
    try:
        os.chmod(socket_path, 0o600)
        if os.geteuid() == 0:
            os.chown(socket_path, owner, owner)
        yield
    finally:
        server.close()
        for task in list(open_now):  # a connection whose far end never closes ends with the bridge
            task.cancel()
        await asyncio.gather(*open_now, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), timeout=5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
