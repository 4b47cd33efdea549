"""A sandbox server: one world of one kind, served over HTTP to the agents that claimed it.

Contract:
- One process (or one in-process app) per sandbox: it owns the world (and any process the world runs).
- `POST /open {epoch, holder}` starts a claim: a newer epoch resets the world and becomes current; the current
  epoch again is a no-op (a retried open); an older one is refused with 409. Epochs come from the ledger lease,
  so they only grow: a zombie holder can neither reopen nor act once a newer claim opened. A world that cannot
  be brought up for the new epoch answers 503, and the epoch does not change.
- `POST /act {epoch, seat, action}` acts for a seat under the current epoch (409 otherwise, and when a newer
  claim's reset killed the action; 400 for a seat out of range or an action the world rejects, with the reason;
  503 when the world is lost for this claim).
- `GET /health` answers the kind, name, seats and current epoch.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollout.sandbox.jail import CommandKilled
from rollout.sandbox.world import SandboxWorld, SandboxWorldLost


class _Claims:
    def __init__(self) -> None:
        self.epoch = 0
        self.holder = ""
        self.lock = asyncio.Lock()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) and isinstance(body.get("epoch"), int) else None


def build_sandbox_app(world: SandboxWorld, *, kind: str, name: str, seats: int) -> Starlette:
    claims = _Claims()

    async def open_claim(request: Request) -> JSONResponse:
        body = await _body(request)
        if body is None:
            return _error(400, "send JSON {epoch: int, holder: str}")
        epoch = body["epoch"]
        async with claims.lock:
            if epoch < claims.epoch:
                return _error(
                    409, f"claim epoch {epoch} is superseded by epoch {claims.epoch} ({claims.holder})"
                )
            if epoch > claims.epoch:
                try:
                    await world.reset()
                except SandboxWorldLost as error:
                    return _error(503, str(error))
                claims.epoch, claims.holder = epoch, str(body.get("holder", ""))
        return JSONResponse({"epoch": claims.epoch, "holder": claims.holder, "seats": seats})

    async def act(request: Request) -> JSONResponse:
        body = await _body(request)
        if body is None or not isinstance(body.get("action"), dict) or not isinstance(body.get("seat"), int):
            return _error(400, "send JSON {epoch: int, seat: int, action: object}")
        if body["epoch"] != claims.epoch:
            return _error(
                409, f"claim epoch {body['epoch']} is not the sandbox's current epoch {claims.epoch}"
            )
        seat = body["seat"]
        if not 0 <= seat < seats:
            return _error(400, f"seat {seat} is out of range: this sandbox has seats 0..{seats - 1}")
        try:
            result = await world.act(seat, body["action"])
        except ValueError as error:
            return _error(400, str(error))
        except SandboxWorldLost as error:
            return _error(503, str(error))
        except CommandKilled as error:
            return _error(409, f"{error} (epoch {claims.epoch} is current)")
        return JSONResponse(result)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"kind": kind, "name": name, "seats": seats, "epoch": claims.epoch})

    return Starlette(
        routes=[
            Route("/open", open_claim, methods=["POST"]),
            Route("/act", act, methods=["POST"]),
            Route("/health", health),
        ]
    )
