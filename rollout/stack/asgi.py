"""Serve an ASGI app inside the running event loop, for as long as a block lasts (env check, tests, benchmarks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.types import ASGIApp

from rollout.stack.processes import free_port


@asynccontextmanager
async def serving(app: ASGIApp, host: str = "127.0.0.1", port: int | None = None) -> AsyncIterator[str]:
    """Serve `app` on `port` (a free one by default); yields its base URL once it accepts connections."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
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
