"""Operator actions over HTTP, for an agent host on another machine: open a seat, pause or resume a run, set
its max_lag (what `rollout seat new` and `rollout run pause|resume|set` do from the stack's own machine).

Routes:
- `POST /operator/seats` `{agent, policy?, run?, episode?, checkpoint?}` → 201 `{seat, api_key, base_url}`
- `POST /operator/runs/{run}/pause`, `POST /operator/runs/{run}/resume` → 200, the run's status
- `POST /operator/runs/{run}/max_lag` `{max_lag: N}` → 200, the run's status

Contract:
- Who may: every route needs `Authorization: Bearer <operator key>`, wherever the gateway listens (a proxy,
  `kubectl port-forward` or an SSH tunnel makes a loopback port anyone's): no key → 401, any other key → 403,
  and a seat token is never an operator key. Keys are compared in constant time. A web page cannot send the
  key, and a DNS-rebinding one is refused by its Host before any route sees it (rollout.gateway.app).
- The operator key is made once in the data directory (`operator.key`, mode 600) by `load_operator_key`.
- A seat's id is made here (`manual/{12 hex}`), never taken from the client: a seat's token is derived from
  its id, so an id chosen by the client would hand out another seat's token. A field a route does not know, or
  one of the wrong type, → 400 naming it; a body that is not `application/json` → 415.
- Run control goes to the `RunControl` the launcher gives (this package imports no workflow code); it records
  the change in the ledger and applies it, as the CLI does. No run playing → 404; refused by the run → 409; no
  run control, or Temporal not answering → 503.
- Every refusal is `{"error": {"type": ..., "message": ...}}`.
"""

from __future__ import annotations

import hmac
import json
import secrets
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollout.gateway.seats import open_seat
from rollout.ledger import Ledger
from rollout.run.settings import BadRunSetting, max_lag_of
from rollout.security.http_guard import json_body_refusal
from rollout.security.keyfiles import secret_file

OPERATOR_KEY_FILE = "operator.key"
SEAT_FIELDS = ("agent", "policy", "run", "episode", "checkpoint")
MAX_FIELD_CHARS = 200


class RunControl(Protocol):
    """What the operator routes ask of a run; each returns the run's status after the change."""

    async def pause(self, run: str) -> Mapping[str, Any]: ...
    async def resume(self, run: str) -> Mapping[str, Any]: ...
    async def set_max_lag(self, run: str, max_lag: int) -> Mapping[str, Any]: ...


class RunControlError(Exception):
    """A run control that could not be applied: `status` is 404 (no such run playing), 409 (the run refused
    it) or 503 (it could not be sent)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class OperatorRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_ERROR_TYPES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    415: "unsupported_media_type",
    503: "unavailable",
}


def load_operator_key(data_dir: Path) -> str:
    """The operator key of the gateway whose data directory this is, made once (mode 600)."""
    return secret_file(data_dir / OPERATOR_KEY_FILE, lambda: f"ro-{secrets.token_hex(24)}".encode()).decode()


@dataclass(frozen=True)
class Operator:
    key: str
    seat_secret: bytes
    runs: RunControl | None = None

    def check(self, request: Request) -> None:
        """Refuse the request unless its key is the operator key."""
        auth = request.headers.get("authorization")
        if auth is None:
            raise OperatorRefused(
                401,
                "operator routes need `Authorization: Bearer <operator key>`: the key is in the gateway's data "
                f"directory, {OPERATOR_KEY_FILE}",
            )
        scheme, _, given = auth.partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            raise OperatorRefused(401, "send the operator key as `Authorization: Bearer <operator key>`")
        if given.startswith("rs-"):
            raise OperatorRefused(403, "a seat token is not an operator key: seats sample, operators manage")
        if not hmac.compare_digest(given.encode(), self.key.encode()):
            raise OperatorRefused(403, "that is not this gateway's operator key")


def _error(status: int, message: str) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(
        {"error": {"type": _ERROR_TYPES.get(status, "error"), "message": message}}, status, headers=headers
    )


async def _body(request: Request, allowed: tuple[str, ...]) -> dict[str, Any]:
    if (refusal := json_body_refusal(request.headers)) is not None:
        raise OperatorRefused(415, refusal)
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise OperatorRefused(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise OperatorRefused(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise OperatorRefused(
            400, f"unknown field '{unknown[0]}': this route takes {', '.join(allowed) or 'no fields'}"
        )
    return body


def _text(body: dict[str, Any], name: str, default: str | None) -> str | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip():
        raise OperatorRefused(400, f"'{name}' must be a non-empty string")
    if len(value) > MAX_FIELD_CHARS or any(ord(c) < 0x20 for c in value):
        raise OperatorRefused(
            400, f"'{name}' must be at most {MAX_FIELD_CHARS} characters, none of them control characters"
        )
    return value


def operator_routes(ledger: Ledger, operator: Operator) -> list[Route]:
    def guarded(action: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            try:
                operator.check(request)
                return await action(request)
            except OperatorRefused as refused:
                return _error(refused.status, str(refused))
            except RunControlError as failed:
                return _error(failed.status, str(failed))

        return handle

    async def new_seat(request: Request) -> Response:
        body = await _body(request, SEAT_FIELDS)
        seat, token = await open_seat(
            ledger,
            operator.seat_secret,
            seat_id=f"manual/{uuid.uuid4().hex[:12]}",
            agent=_text(body, "agent", "agent") or "agent",
            policy=_text(body, "policy", "default") or "default",
            run=_text(body, "run", None),
            episode=_text(body, "episode", None),
            checkpoint=_text(body, "checkpoint", None),
        )
        base_url = f"{str(request.base_url).rstrip('/')}/s/{token}/v1"
        return JSONResponse({"seat": seat.seat_id, "api_key": token, "base_url": base_url}, 201)

    def runs() -> RunControl:
        if operator.runs is None:
            raise OperatorRefused(503, "this gateway was started without run control (no Temporal address)")
        return operator.runs

    async def pause(request: Request) -> Response:
        await _body(request, ())
        return JSONResponse(dict(await runs().pause(request.path_params["run"])))

    async def resume(request: Request) -> Response:
        await _body(request, ())
        return JSONResponse(dict(await runs().resume(request.path_params["run"])))

    async def max_lag(request: Request) -> Response:
        body = await _body(request, ("max_lag",))
        try:
            value = max_lag_of(body.get("max_lag"))
        except BadRunSetting as error:
            raise OperatorRefused(400, str(error)) from None
        return JSONResponse(dict(await runs().set_max_lag(request.path_params["run"], value)))

    return [
        Route("/operator/seats", guarded(new_seat), methods=["POST"]),
        Route("/operator/runs/{run}/pause", guarded(pause), methods=["POST"]),
        Route("/operator/runs/{run}/resume", guarded(resume), methods=["POST"]),
        Route("/operator/runs/{run}/max_lag", guarded(max_lag), methods=["POST"]),
    ]
