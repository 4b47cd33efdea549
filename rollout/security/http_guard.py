"""What every HTTP server of rollout's own (the gateway, the local engine server, a sandbox) refuses before
its routes act on a request, and its errors in JSON.

Contract:
- `Hosts.bound_to(host)`: the `Host` headers a server listening on `host` answers to. On loopback
  (127.0.0.0/8, ::1, `localhost`) loopback's own names only (`localhost`, any 127.0.0.0/8 address, `::1`): a
  web page that rebinds its own name to 127.0.0.1 (DNS rebinding) sends that name and is refused, and a proxy
  or tunnel in front of such a server must pass a loopback Host on (`kubectl port-forward` and SSH tunnels
  do). Beyond loopback (0.0.0.0, ::, an interface's address or name) any Host: such a server is reached by
  names it cannot know (a Service, an ingress, a pod's address), and what guards it there is its routes'
  keys. `Hosts(names)` answers to loopback's own names and `names` (a sandbox's: rollout.sandbox.hosting).
- `HostGuard(app, hosts=, error=)` is ASGI middleware: a request whose Host `hosts` does not allow (no Host
  included) is answered 421 by `error(path, 421, message)`, in the app's own error shape, before any route
  sees it.
- `BearerKey(app, key=, error=, open_paths=, named=)` is ASGI middleware: a request to any path but
  `open_paths` (`/health` by default) that does not carry `Authorization: Bearer <key>` is answered 401 by
  `error(path, 401, message)` with `WWW-Authenticate: Bearer`, before any route sees it (an unknown path too:
  what is served is not told to whoever holds no key). The key is compared in constant time (SHA-256 digests
  of both, as vLLM's own `--api-key` check does, so not even its length is told).
- `json_body_refusal(headers)` says why a request's body may not be read as JSON, or None: a body whose
  Content-Type is not `application/json` (parameters such as `; charset=utf-8` allowed), or has none. An
  empty body passes whatever it is declared (clients POST `/sleep` so, aiohttp as
  `application/octet-stream`), unless the request carries an `Origin`: a web page may send an empty POST, a
  form or text/plain to any origin without asking, never `application/json`. `JsonBodies(app, error=)` is
  that check as route middleware, answering 415.
- `json_errors(error)` are Starlette exception handlers answering an `HTTPException` (404, 405 with its
  `Allow`, 413) in the app's JSON error shape rather than Starlette's plain text.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

ErrorResponse = Callable[[str, int, str], Response]
"""(the request's path, a status, a one-sentence message) → the response in the app's own error shape."""

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether `host` (a bind address or a Host header's name) is this machine only: `localhost`, 127.0.0.0/8
    or ::1."""
    host = host.strip().strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def host_name(header: str) -> str:
    """The name a `Host` header names, without its port or an IPv6 address's brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    name, colon, port = header.rpartition(":")
    return name if colon and port.isdigit() and ":" not in name else header


@dataclass(frozen=True)
class Hosts:
    """The Host names a server answers to: loopback's own always, `names`, and any when `any_host`."""

    names: frozenset[str] = frozenset()
    any_host: bool = False

    @classmethod
    def bound_to(cls, host: str) -> Hosts:
        return cls() if is_loopback(host) else cls(any_host=True)

    def allows(self, header: str | None) -> bool:
        if self.any_host:
            return True
        if not header:
            return False
        name = host_name(header)
        return is_loopback(name) or name.rstrip(".") in {n.lower() for n in self.names}

    def described(self) -> str:
        return ", ".join(sorted({*LOOPBACK_NAMES, *(n.lower() for n in self.names)}))


class HostGuard:
    """ASGI middleware: refuses (421) a request whose Host the server does not answer to."""

    def __init__(self, app: ASGIApp, *, hosts: Hosts, error: ErrorResponse) -> None:
        self.app, self.hosts, self.error = app, hosts, error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = Headers(scope=scope).get("host")
            if not self.hosts.allows(given):
                message = (
                    f"this server answers to Host {self.hosts.described()}, not {given or 'none'!r}: reach it "
                    "by one of those names (a proxy in front of it must pass one on)"
                )
                await self.error(scope["path"], 421, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (the scheme in any case); None without one."""
    scheme, _, key = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def same_key(given: str, key: str) -> bool:
    """Whether `given` is `key`, in time that tells nothing of either (their digests are compared)."""
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(key.encode()).digest())


class BearerKey:
    """ASGI middleware: refuses (401) a request without `Authorization: Bearer <key>`, but to `open_paths`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        key: str,
        error: ErrorResponse,
        open_paths: frozenset[str] = frozenset({"/health"}),
        named: str = "this server's key",
    ) -> None:
        if not key:
            raise ValueError("a server's key may not be empty: every route it guards would be open")
        self.app, self.key, self.error, self.open_paths, self.named = app, key, error, open_paths, named

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            given = bearer_key(Headers(scope=scope))
            if given is None or not same_key(given, self.key):
                message = (
                    f"send {self.named} as `Authorization: Bearer <key>`"
                    if given is None
                    else f"the key sent is not {self.named}"
                )
                response = self.error(scope["path"], 401, message)
                response.headers["www-authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def json_body_refusal(headers: Mapping[str, str]) -> str | None:
    """Why this request's body may not be read as JSON; None when it may (see the module's contract)."""
    kind = headers.get("content-type")
    if kind is not None and kind.partition(";")[0].strip().lower() == "application/json":
        return None
    empty = headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers
    if empty and "origin" not in headers:
        return None
    return (
        f"this route takes a JSON body, not {kind or 'one without a Content-Type'}: send it with "
        "`Content-Type: application/json`"
    )


class JsonBodies:
    """Route middleware: refuses (415) a request whose body is not declared `application/json`."""

    def __init__(self, app: ASGIApp, *, error: ErrorResponse) -> None:
        self.app, self.error = app, error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (refusal := json_body_refusal(Headers(scope=scope))) is not None:
            await self.error(scope["path"], 415, refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def json_errors(
    error: ErrorResponse,
) -> dict[type[Exception], Callable[[Request, Exception], Awaitable[Response]]]:
    """Starlette's `exception_handlers` answering its HTTPExceptions (404, 405, 413) by `error`."""

    async def answer(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path, headers = request.url.path, dict(exc.headers or {})
        if exc.status_code == 404:
            message = f"nothing is served at {path}: check the URL's path"
        elif exc.status_code == 405:
            message = f"{path} does not take {request.method}: use {headers.get('Allow', 'another method')}"
        elif exc.status_code == 413:
            message = "the request body is over this server's limit: send a smaller one"
        else:
            message = str(exc.detail)
        response = error(path, exc.status_code, message)
        response.headers.update(headers)
        return response

    return {HTTPException: answer}
