"""The embedded Temporal's web UI behind a Host check: the dev server's UI checks no `Host`, so a web page
that rebinds its own name to 127.0.0.1 (DNS rebinding) could read workflows' inputs and terminate them.

Contract:
- `python -m rollout.stack.temporal_ui HOST PORT -- TEMPORAL_COMMAND...` runs the Temporal dev server
  command with its `--ui-ip`/`--ui-port` set here (loopback, a port chosen free at each start that only this
  process is told), and serves on HOST:PORT a reverse proxy to that UI. The proxy answers only the `Host`s
  `Hosts.bound_to(HOST)` allows (on loopback, loopback's own names: rollout.security.http_guard), 421
  otherwise, and passes every other request and answer through unchanged but for hop-by-hop headers, the
  answer streamed.
- It lives as long as Temporal does and exits with its exit code. SIGTERM or SIGINT stop Temporal first, so
  its SQLite file is closed cleanly; killed outright, it takes Temporal with it (Temporal is started with
  SIGKILL as its parent-death signal), so the stack never keeps a Temporal whose UI nobody guards. The two
  share a process group, which this process leads: stopping Temporal whole is signalling that group.
- Temporal's output is this process's: its "address already in use" reaches the service's log as before.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import httpx
import uvicorn
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rollout.net import free_port
from rollout.security.http_guard import HostGuard, Hosts

PR_SET_PDEATHSIG = 1
# Headers of one connection, not of the request (RFC 9110 7.6.1), and those the proxy sets itself.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)


def _refusal(path: str, status: int, message: str) -> Response:
    return JSONResponse({"error": message, "path": path}, status_code=status)


def guarded_proxy(upstream: str, hosts: Hosts) -> ASGIApp:
    """An ASGI app passing every request to `upstream` (a base URL), behind `HostGuard(hosts)`."""
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(60.0, read=None))

    async def forward(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)

        async def body() -> AsyncIterator[bytes]:
            async for chunk in request.stream():
                yield chunk

        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        outgoing = client.build_request(
            request.method,
            httpx.URL(path=request.url.path, query=request.url.query.encode()),
            headers=headers,
            content=body(),
        )
        try:
            answer = await client.send(outgoing, stream=True)
        except httpx.HTTPError as error:
            response: Response = _refusal(request.url.path, 502, f"Temporal's web UI did not answer: {error}")
        else:
            kept = {
                k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}
            }
            response = StreamingResponse(
                answer.aiter_raw(),
                status_code=answer.status_code,
                headers=kept,
                background=BackgroundTask(answer.aclose),
            )
        await response(scope, receive, send)

    return HostGuard(forward, hosts=hosts, error=_refusal)


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:
        """None of uvicorn's: ours (in `run`) stop Temporal first, and the proxy when Temporal has ended."""


def _die_with_parent() -> None:
    # Killed outright, the guard takes Temporal with it at once: a new pair started meanwhile finds its ports.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


async def run(host: str, port: int, temporal: Sequence[str]) -> int:
    inner = free_port("127.0.0.1")
    command = [*temporal, "--ui-ip", "127.0.0.1", "--ui-port", str(inner)]
    process = await asyncio.create_subprocess_exec(*command, preexec_fn=_die_with_parent)
    app = guarded_proxy(f"http://127.0.0.1:{inner}", Hosts.bound_to(host))
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, process.terminate)
    serving = asyncio.create_task(server.serve())
    ended = asyncio.create_task(process.wait())
    await asyncio.wait((serving, ended), return_when=asyncio.FIRST_COMPLETED)
    if not ended.done():  # the proxy could not serve (uvicorn said why: a taken port, say)
        process.terminate()
        await ended
        return 1
    server.should_exit = True
    await asyncio.gather(serving, return_exceptions=True)
    return ended.result()


def main(argv: Sequence[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m rollout.stack.temporal_ui HOST PORT -- TEMPORAL_COMMAND...", file=sys.stderr)
        return 2
    return asyncio.run(run(argv[0], int(argv[1]), argv[3:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
