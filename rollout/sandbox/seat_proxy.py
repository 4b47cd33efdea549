"""A command seat's way to its own gateway seat, and nowhere else: an HTTP proxy on a Unix socket a jail
binds.

Contract:
- `seat_proxy(socket_path, upstream, prefix, owner=)` serves HTTP on the Unix socket `socket_path` (mode 0600,
  owned by `owner`, the jail's uid, when run by root) while the context is open. A request whose raw path
  starts with `prefix` (the seat's own `/s/{token}/`) and has no dot segment, encoded slash or backslash is
  forwarded to `upstream` (the gateway's base URL) with its method, query, headers (less hop-by-hop ones, Host
  and Content-Length) and body (streamed), and the answer is streamed back as it comes (server-sent events
  included, bytes unchanged). Any other request gets 403 with a JSON error and reaches nothing; one the
  gateway does not answer gets 502.
- It is the only address a jailed command seat reaches (rollout.sandbox.relay pumps the jail's loopback port
  to it): never the ledger, Temporal, the engine or the gateway's operator routes.
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def allowed(raw_path: str, prefix: str) -> bool:
    """Whether a request's raw path (as sent, before any decoding) stays inside the seat's own routes."""
    if not raw_path.startswith(prefix):
        return False
    lowered = raw_path.lower()
    if "%2f" in lowered or "%5c" in lowered or "\\" in raw_path:
        return False
    segments = urllib.parse.unquote(raw_path.split("?", 1)[0]).split("/")
    return not any(segment in (".", "..") for segment in segments)


def _forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


CLIENT = web.AppKey("client", aiohttp.ClientSession)


def _app(upstream: str, prefix: str) -> web.Application:
    base = upstream.rstrip("/")
    app = web.Application(client_max_size=0)

    async def on_startup(app: web.Application) -> None:
        app[CLIENT] = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
        )

    async def on_cleanup(app: web.Application) -> None:
        await app[CLIENT].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        raw = request.raw_path
        if not allowed(raw, prefix):
            return web.json_response(
                {
                    "error": {
                        "message": "a command seat reaches only its own seat's routes",
                        "type": "forbidden",
                    }
                },
                status=403,
            )
        body = request.content.iter_chunked(64 * 1024) if request.body_exists else None
        try:
            answer = await app[CLIENT].request(
                request.method, base + raw, headers=_forwarded(request.headers), data=body
            )
        except aiohttp.ClientError as error:
            return web.json_response(
                {"error": {"message": f"the gateway did not answer: {error}", "type": "bad_gateway"}},
                status=502,
            )
        async with answer:
            response = web.StreamResponse(status=answer.status, reason=answer.reason)
            response.headers.update(_forwarded(answer.headers))
            await response.prepare(request)
            with contextlib.suppress(aiohttp.ClientError):  # the gateway went away mid-answer: cut it short
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            return response

    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


@contextlib.asynccontextmanager
async def seat_proxy(socket_path: Path, upstream: str, prefix: str, *, owner: int) -> AsyncIterator[None]:
    runner = web.AppRunner(_app(upstream, prefix), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(socket_path)).start()
        os.chmod(socket_path, 0o600)
        if os.geteuid() == 0:
            os.chown(socket_path, owner, owner)
        yield
    finally:
        await runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
