"""A sandbox server: one world of one kind, served over HTTP to the agents that claimed it.

Contract:
- One process (or one in-process app) per sandbox: it owns the world (and any process the world runs).
- Every route but `/health` needs the claim's secret (`Authorization: Bearer rsc-…`, rollout.sandbox.keys) of
  the epoch and holder the body names: without it 401, with a wrong one 403 (and nothing about the sandbox's
  claims is said). A request whose `Host` is not one this server answers to (`hosts`, and loopback's own
  names) is refused with 421 before any route sees it (rollout.security.http_guard), and one that carries an
  `Origin` (a web page's) with 403: a page in a browser on this machine cannot reach it, not even by DNS
  rebinding. Bodies must be JSON objects, declared `application/json` (415 otherwise). A path no route serves
  → 404, a method a route does not take → 405. Every error is `{"error": message}`.
- `POST /open {epoch, holder, limits?, network?}` starts a claim: a newer epoch resets the world and becomes
  current; the current epoch again is a no-op (a retried open); an older one is refused with 409. A kind that
  runs agents' commands is first configured with the claim's `limits` (rollout.security.isolation.JailLimits
  as JSON) and `network` (`SandboxNetwork.entries()`); 400 when they are malformed, when an endpoint leads to
  one of `refused_endpoints` (the stack's own services: names are resolved and their addresses compared, every
  loopback address and this machine's name as one), when it does not resolve, or when the kind runs no
  commands. While a newer claim resets the world, every act is refused (409): none starts in the next claim.
  Epochs come from the ledger lease, so they only grow: a zombie holder can neither reopen nor act once a
  newer claim opened. A world that cannot be brought up for the new epoch answers 503, and the epoch does not
  change.
- `POST /act {epoch, holder, seat, action, gateway?}` acts for a seat under the current epoch (`gateway`: the
  seat's own gateway routes, for a claim whose network names `gateway`) (409 otherwise, and when a newer
  claim's reset killed the action; 400 for a seat out of range or an action the world rejects, with the
  reason; 503 when the world is lost for this claim).
- `GET /health` answers the kind, name and seats: never the current epoch or holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from typing import Any, Protocol, cast

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollout.sandbox.jail import CommandKilled
from rollout.sandbox.keys import kind_claim_secret, same_secret
from rollout.sandbox.world import JsonObject, SandboxWorld, SandboxWorldLost
from rollout.security.http_guard import HostGuard, Hosts, JsonBodies, json_errors
from rollout.security.isolation import Endpoint, JailLimits, SandboxNetwork

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class _Claims:
    def __init__(self) -> None:
        self.epoch = 0
        self.holder = ""
        self.lock = asyncio.Lock()
        self.changing = False  # a newer claim is resetting the world: no act starts meanwhile


def _bearer(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _refused(path: str, status: int, message: str) -> JSONResponse:
    """A refusal before any route acted (rollout.security.http_guard)."""
    return _error(status, message)


async def _body(request: Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) and isinstance(body.get("epoch"), int) else None


class CommandWorld(SandboxWorld, Protocol):
    """A kind that runs agents' commands (`runs_agent_commands`): configured per claim, acted on with a
    gateway."""

    async def configure(self, limits: JailLimits | None, network: SandboxNetwork) -> None: ...

    async def act(self, seat: int, action: JsonObject, *, gateway: str = "") -> JsonObject: ...


def _is_loopback(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    return False


async def _addresses(host: str, port: int) -> set[str]:
    """Where `host` leads: its addresses (every loopback one, and this machine's own name's, as
    `loopback`)."""
    try:
        found = await asyncio.wait_for(
            asyncio.to_thread(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM), timeout=10
        )
    except (OSError, TimeoutError):
        return set()
    own = {host.lower() for host in (socket.gethostname(), "0.0.0.0", "::")}
    addresses = {str(entry[4][0]) for entry in found}
    return {"loopback" if _is_loopback(a) or a in own else a for a in addresses} | (
        {"loopback"} if host.lower() in own else set()
    )


async def _claim_jail(
    body: dict[str, Any], world: SandboxWorld, refused: frozenset[Endpoint]
) -> tuple[JailLimits | None, SandboxNetwork] | None:
    """The limits and network an `/open` names for a world that runs agents' commands (None for another kind);
    ValueError for what is malformed, leads to a stack's service (by any name: the addresses are compared), or
    asks a kind that runs no commands."""
    named = "limits" in body or "network" in body
    if not getattr(world, "runs_agent_commands", False):
        if named:
            raise ValueError(
                "this sandbox kind runs no agents' commands: `limits` and `network` do not apply"
            )
        return None
    limits = JailLimits.from_json(body["limits"]) if body.get("limits") is not None else None
    listed = body.get("network", [])
    if not isinstance(listed, list):
        raise ValueError("`network` is a list of `gateway` and `host:port`")
    network = SandboxNetwork.parse(listed)
    stack: set[tuple[str, int]] = set()
    for service in refused if network.endpoints else ():
        stack |= {(address, service.port) for address in await _addresses(service.host, service.port)}
    for endpoint in network.endpoints:
        addresses = await _addresses(endpoint.host, endpoint.port)
        if not addresses:
            raise ValueError(f"a sandbox's network names {endpoint}, which does not resolve here")
        if any((address, endpoint.port) in stack for address in addresses):
            raise ValueError(
                f"a sandbox's network may not reach {endpoint}: it is one of the stack's own services (the "
                "ledger, Temporal, an engine, the gateway or the dashboard); use `gateway` to reach a seat's model"
            )
    return limits, network


def build_sandbox_app(
    world: SandboxWorld,
    *,
    kind: str,
    name: str,
    seats: int,
    key: bytes,
    hosts: frozenset[str] | None = None,
    refused_endpoints: frozenset[Endpoint] = frozenset(),
) -> Starlette:
    """The app serving `world`; `key` is its kind's key claims are proven with (rollout.sandbox.keys),
    `hosts` the names it answers to (loopback's by default), `refused_endpoints` what no claim's network may
    name (the stack's own services)."""
    claims = _Claims()

    def refused(request: Request) -> JSONResponse | None:
        if "origin" in request.headers:
            return _error(403, "requests from a web page (an Origin header) are refused")
        return None

    async def open_claim(request: Request) -> JSONResponse:
        if (refusal := refused(request)) is not None:
            return refusal
        body = await _body(request)
        if body is None or not isinstance(body.get("holder", ""), str):
            return _error(400, "send JSON {epoch: int, holder: str}")
        epoch, holder = body["epoch"], str(body.get("holder", ""))
        given = _bearer(request)
        if not given:
            return _error(401, "send the claim's secret as `Authorization: Bearer rsc-…`")
        expected = kind_claim_secret(key, kind, name, epoch, holder)
        if not same_secret(given, expected):
            return _error(403, "that is not the secret of this claim")
        try:
            jail = await _claim_jail(body, world, refused_endpoints)
        except ValueError as error:
            return _error(400, str(error))
        async with claims.lock:
            if epoch < claims.epoch:
                return _error(
                    409, f"claim epoch {epoch} is superseded by epoch {claims.epoch} ({claims.holder})"
                )
            if epoch > claims.epoch:
                claims.changing = True
                try:
                    if jail is not None:
                        await cast(CommandWorld, world).configure(*jail)
                    await world.reset()
                except SandboxWorldLost as error:
                    return _error(503, str(error))
                except ValueError as error:  # a claim this kind will not configure
                    return _error(400, str(error))
                finally:
                    claims.changing = False
                claims.epoch, claims.holder = epoch, holder
        return JSONResponse({"epoch": claims.epoch, "holder": claims.holder, "seats": seats})

    async def act(request: Request) -> JSONResponse:
        if (refusal := refused(request)) is not None:
            return refusal
        given = _bearer(request)
        if not given:
            return _error(401, "send the claim's secret as `Authorization: Bearer rsc-…`")
        body = await _body(request)
        if (
            body is None
            or not isinstance(body.get("action"), dict)
            or not isinstance(body.get("seat"), int)
            or not isinstance(body.get("holder", ""), str)
        ):
            return _error(400, "send JSON {epoch: int, holder: str, seat: int, action: object}")
        if not same_secret(given, kind_claim_secret(key, kind, name, body["epoch"], body.get("holder", ""))):
            return _error(403, "that is not the secret of this claim")
        if body["epoch"] != claims.epoch or claims.changing:
            return _error(
                409, f"claim epoch {body['epoch']} is not the sandbox's current epoch {claims.epoch}"
            )
        seat = body["seat"]
        if not 0 <= seat < seats:
            return _error(400, f"seat {seat} is out of range: this sandbox has seats 0..{seats - 1}")
        gateway = body.get("gateway")
        try:
            if isinstance(gateway, str) and getattr(world, "runs_agent_commands", False):
                result = await cast(CommandWorld, world).act(seat, body["action"], gateway=gateway)
            else:
                result = await world.act(seat, body["action"])
        except ValueError as error:
            return _error(400, str(error))
        except SandboxWorldLost as error:
            return _error(503, str(error))
        except CommandKilled as error:
            return _error(409, f"{error} (epoch {claims.epoch} is current)")
        return JSONResponse(result)

    async def health(request: Request) -> JSONResponse:
        if (refusal := refused(request)) is not None:
            return refusal
        return JSONResponse({"kind": kind, "name": name, "seats": seats})

    json_only = [Middleware(JsonBodies, error=_refused)]
    return Starlette(
        routes=[
            Route("/open", open_claim, methods=["POST"], middleware=json_only),
            Route("/act", act, methods=["POST"], middleware=json_only),
            Route("/health", health),
        ],
        middleware=[Middleware(HostGuard, hosts=Hosts(names=hosts or LOOPBACK_HOSTS), error=_refused)],
        exception_handlers=json_errors(_refused),
    )
