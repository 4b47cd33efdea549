"""The gateway's HTTP face: routes, seat authentication, and each dialect's responses, streams and errors.

Routes, each under `/v1` and under `/s/{token}/v1` (the seat's base URL):
`POST chat/completions` (OpenAI Chat), `POST responses` (OpenAI Responses), `POST messages` and
`POST messages/count_tokens` (Anthropic), `GET models`; and `GET /openapi.json`, `GET /health`.

Contract:
- A request names its seat by the base URL's token, `x-api-key`, or `Authorization: Bearer`. No token or an
  unknown one → 401; a closed seat → 410; each in the route's own error shape.
- A body over `max_request_bytes` (by its Content-Length, or as it streams in without one) → 413, before any of
  it is parsed or tokenised. A body that is not UTF-8 JSON (NaN and lone surrogates included) → 400.
- Each dialect validates its body against its published schema (`rollout.gateway.schemas`): a violation → 400
  naming the field (`messages[2].content`); so is a token budget over the model's context. A prompt over the
  context → 400; no admitted engine → 503 with `Retry-After`. Nothing here crashes on a model's output:
  unparseable tool calls come back as text.
- `GET /openapi.json` is the OpenAPI 3.1 document of those routes, made from the same schemas
  (`rollout.gateway.openapi`).
- Operator routes (`/operator/...`, rollout.gateway.operator) are served when `build_app` is given an `Operator`.
- A streamed turn is recorded after its last content frame and before its terminating frame; if the client went
  away before that, the turn is recorded as aborted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rollout.engines.protocol import EngineUnavailable
from rollout.gateway.dialects.anthropic_messages import AnthropicMessages
from rollout.gateway.dialects.common import Dialect
from rollout.gateway.dialects.openai_chat import OpenAIChat
from rollout.gateway.dialects.openai_responses import OpenAIResponses
from rollout.gateway.openapi import document
from rollout.gateway.operator import Operator, operator_routes
from rollout.gateway.requests import BadRequest, Turn, decode_json
from rollout.gateway.seats import Seat, resolve, resolve_for_turn
from rollout.gateway.service import Gateway, Sampled

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4 * 1024 * 1024  # services.gateway.max_request_bytes


class _Refused(Exception):
    def __init__(
        self, status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.status, self.field, self.headers = status, field, headers or {}


def _token(request: Request) -> str | None:
    if "token" in request.path_params:
        return request.path_params["token"]
    if key := request.headers.get("x-api-key"):
        return key
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


class SSEResponse:
    """Send precomputed SSE frames; record the turn before the final frame, or as aborted if the client left."""

    def __init__(
        self, gateway: Gateway, outcome: Turn | Sampled, frames: list[bytes], last: list[bytes]
    ) -> None:
        self.gateway, self.outcome, self.frames, self.last = gateway, outcome, frames, last

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.create_task(watch())
        recorded = isinstance(self.outcome, Turn)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                    ],
                }
            )
            for frame in self.frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await asyncio.sleep(0)  # let a pending disconnect be noticed before the turn is recorded
            if disconnected.is_set():
                raise ConnectionError("client disconnected")
            if isinstance(self.outcome, Sampled):
                await self.gateway.record(self.outcome)
                recorded = True
            for frame in self.last:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, ConnectionError, asyncio.CancelledError) as error:
            if not recorded and isinstance(self.outcome, Sampled):
                await asyncio.shield(
                    self.gateway.record_aborted(self.outcome, f"stream aborted: {type(error).__name__}")
                )
            if isinstance(error, asyncio.CancelledError):
                raise
        finally:
            watcher.cancel()


def build_app(
    gateway: Gateway,
    *,
    model_names: list[str],
    max_request_bytes: int = MAX_REQUEST_BYTES,
    operator: Operator | None = None,
) -> Starlette:
    """The gateway's routes; with `operator`, its operator routes too (rollout.gateway.operator)."""
    chat, responses, messages = OpenAIChat(), OpenAIResponses(), AnthropicMessages()
    openapi = document(max_context=gateway.max_context)
    too_large = f"the request body is over the gateway's limit of {max_request_bytes} bytes"

    async def seat_of(request: Request) -> Seat:
        token = _token(request)
        seat = await resolve(gateway.ledger, token) if token else None
        return check_seat(seat, request)

    def check_seat(seat: Seat | None, request: Request) -> Seat:
        if not _token(request):
            raise _Refused(
                401, "no seat token: use the seat's base URL (/s/TOKEN/v1) or send it as the API key"
            )
        if seat is None:
            raise _Refused(401, "unknown seat token: open a seat with `rollout seat new`")
        if not seat.open:
            raise _Refused(410, f"seat {seat.seat_id} is finished: its episode has ended")
        return seat

    async def body_of(request: Request) -> Any:
        # Refused before anything is parsed: by the declared length, or once the streamed bytes pass the limit.
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_request_bytes:
            raise _Refused(413, too_large)
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_request_bytes:
                raise _Refused(413, too_large)
        return decode_json(bytes(raw))

    def endpoint(dialect: Dialect, action: Callable[[Request, Dialect], Awaitable[Response | SSEResponse]]):
        async def handle(request: Request) -> Response | SSEResponse:
            try:
                return await action(request, dialect)
            except _Refused as refused:
                return JSONResponse(
                    dialect.error(refused.status, str(refused), refused.field),
                    refused.status,
                    headers=refused.headers,
                )
            except BadRequest as bad:
                return JSONResponse(dialect.error(bad.status, str(bad), bad.field), bad.status)
            except EngineUnavailable as busy:
                retry = str(max(1, round(busy.retry_after_s)))
                return JSONResponse(dialect.error(503, str(busy), None), 503, headers={"retry-after": retry})

        return handle

    async def complete(request: Request, dialect: Dialect) -> Response | SSEResponse:
        try:
            parsed = dialect.parse(await body_of(request), max_context=gateway.max_context)
        except (BadRequest, _Refused):
            await seat_of(request)  # a bad seat is answered before a bad body
            raise
        # One round trip finds the seat and any turn already recorded for this request (a replay).
        token = _token(request)
        found, recorded = (
            await resolve_for_turn(gateway.ledger, token, gateway.turn_key(parsed)) if token else (None, None)
        )
        seat = check_seat(found, request)
        if not parsed.stream:
            return JSONResponse(dialect.response(await gateway.complete(seat, parsed, recorded=recorded)))
        outcome = await gateway.sample(seat, parsed, recorded=recorded)
        frames, last = dialect.stream(outcome if isinstance(outcome, Turn) else outcome.turn)
        return SSEResponse(gateway, outcome, frames, last)

    async def count_tokens(request: Request, dialect: Dialect) -> Response:
        await seat_of(request)
        parsed = messages.parse(await body_of(request), count_only=True)
        return JSONResponse(
            {"input_tokens": gateway.renderer.count(list(parsed.messages), list(parsed.tools))}
        )

    async def models(request: Request) -> Response:
        if request.headers.get("anthropic-version"):
            data = [
                {"type": "model", "id": n, "display_name": n, "created_at": "2026-01-01T00:00:00Z"}
                for n in model_names
            ]
            return JSONResponse(
                {"data": data, "has_more": False, "first_id": model_names[0], "last_id": model_names[-1]}
            )
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": n, "object": "model", "created": 0, "owned_by": "rollout"} for n in model_names
                ],
            }
        )

    def routes(prefix: str) -> list[Route]:
        return [
            Route(f"{prefix}/v1/chat/completions", endpoint(chat, complete), methods=["POST"]),
            Route(f"{prefix}/v1/responses", endpoint(responses, complete), methods=["POST"]),
            Route(f"{prefix}/v1/messages", endpoint(messages, complete), methods=["POST"]),
            Route(f"{prefix}/v1/messages/count_tokens", endpoint(messages, count_tokens), methods=["POST"]),
            Route(f"{prefix}/v1/models", models, methods=["GET"]),
        ]

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(openapi)

    operator_only = operator_routes(gateway.ledger, operator) if operator is not None else []
    return Starlette(
        routes=[
            *routes(""),
            *routes("/s/{token}"),
            Route("/health", health),
            Route("/openapi.json", openapi_json, methods=["GET"]),
            *operator_only,
        ]
    )
