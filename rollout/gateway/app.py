"""The gateway's HTTP face: routes, seat authentication, and each dialect's responses, streams and errors.

Routes, each under `/v1` and under `/s/{token}/v1` (the seat's base URL):
`POST chat/completions` (OpenAI Chat), `POST responses` (OpenAI Responses), `POST messages` and
`POST messages/count_tokens` (Anthropic), `GET models`; and `GET /openapi.json`, `GET /health`.

Contract:
- A request names its seat by the base URL's token, `x-api-key`, or `Authorization: Bearer`. No token or an
  unknown one → 401; a closed seat → 410; each in the route's own error shape. A turn for a seat this process
  has served before is rendered while its seat is looked up (`Gateway.prepare`); the answer waits for the
  seat.
- A request whose `Host` is not one the gateway answers to (`Hosts.bound_to(host)`,
  rollout.security.http_guard: listening on loopback, loopback's own names only; beyond it, any) → 421, before
  any route sees it.
- A body over `max_request_bytes` (by its Content-Length, or as it streams in without one) → 413, before any
  of it is parsed or tokenised. A body not declared `application/json` (parameters allowed: every OpenAI and
  Anthropic client sends it) → 415. A body that is not UTF-8 JSON (NaN, lone surrogates and NUL characters
  included) → 400.
- A path served by no route → 404, a route asked with a method it does not take → 405; every error, these
  included, is in the dialect's shape (the Anthropic one under `/v1/messages`, OpenAI's elsewhere, the
  operator routes included).
- Each dialect validates its body against its published schema (`rollout.gateway.schemas`): a violation → 400
  naming the field (`messages[2].content`); so is a token budget over the model's context. A prompt over the
  context → 400; no admitted engine → 503 with `Retry-After`; a seat with `max_turns_in_flight_per_seat` turns
  being sampled → 429 with `Retry-After` (a replay is answered still); a stopped run → 410; a run's external
  model at an API base the gateway was not configured with → 403. Nothing here crashes on a model's output:
  unparseable tool calls come back as text. A closed seat's state is forgotten.
- `GET /openapi.json` is the OpenAPI 3.1 document of those routes, made from the same schemas
  (`rollout.gateway.openapi`).
- Operator routes (`/operator/...`, rollout.gateway.operator) are served when `build_app` is given an
  `Operator`; they need the operator key wherever the gateway listens.
- A streaming request streams the reply as the engine samples it (rollout.gateway.live says what is held back
  until it is settled), in the dialect's own events. The turn is recorded after its last content frame and
  before its terminating frame; if the client went away before that, the engine's generation is stopped and
  the turn is recorded as aborted. An engine that fails mid-stream ends the stream without its terminating
  frame (the turn is recorded as aborted too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rollout.engines.protocol import EngineUnavailable
from rollout.gateway.admission import RunStopped
from rollout.gateway.dialects.anthropic_messages import AnthropicMessages
from rollout.gateway.dialects.common import Dialect, StreamWriter, frames_of
from rollout.gateway.dialects.openai_chat import OpenAIChat
from rollout.gateway.dialects.openai_responses import OpenAIResponses
from rollout.gateway.externals import ExternalModelRefused
from rollout.gateway.live import LiveTurn
from rollout.gateway.openapi import document
from rollout.gateway.operator import Operator, operator_routes
from rollout.gateway.requests import BadRequest, Turn, decode_json
from rollout.gateway.sampled import Sampled
from rollout.gateway.seats import Seat, SeenSeats, resolve, resolve_for_turn
from rollout.gateway.seatstate import SeatBusy
from rollout.gateway.service import Gateway
from rollout.security.http_guard import HostGuard, Hosts, json_body_refusal, json_errors

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
    """Stream a turn's SSE frames: a live turn's as its tokens are settled, a whole turn's at once. The turn
    is recorded after its last content frame and before its terminating frame; a client that leaves before
    that stops the engine's generation and leaves the turn recorded as aborted, with what was sampled until
    then."""

    def __init__(self, gateway: Gateway, outcome: Turn | Sampled | LiveTurn, writer: StreamWriter) -> None:
        self.gateway, self.outcome, self.writer = gateway, outcome, writer
        self.recorded = isinstance(outcome, Turn)  # a replay is recorded already
        self.committing = False

    async def _send(self, send: Send, frames: list[bytes]) -> None:
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})

    async def _stream(self, send: Send, disconnected: asyncio.Event) -> None:
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
        outcome = self.outcome
        if isinstance(outcome, LiveTurn):
            await self._send(send, self.writer.start(outcome.model, outcome.prompt_tokens))
            async for kind, text in outcome.deltas():
                await self._send(send, self.writer.delta(kind, text))
            assert outcome.sampled is not None  # set once the deltas end
            sampled: Sampled | None = outcome.sampled
            frames, last = self.writer.end(outcome.sampled.turn)
        else:
            sampled = outcome if isinstance(outcome, Sampled) else None
            frames, last = frames_of(self.writer, outcome if isinstance(outcome, Turn) else outcome.turn)
        await self._send(send, frames)
        await asyncio.sleep(0)  # let a pending disconnect be noticed before the turn is recorded
        if disconnected.is_set():
            raise ConnectionError("client disconnected")
        self.committing = True  # from here a departing client no longer stops the turn: it is recorded whole
        if sampled is not None:
            await self.gateway.record(sampled)
        self.recorded = True
        await self._send(send, last)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _abort(self, reason: str) -> None:
        if self.recorded:
            return
        self.recorded = True
        outcome = self.outcome
        sampled = await outcome.abort() if isinstance(outcome, LiveTurn) else outcome
        if isinstance(sampled, Sampled):
            await self.gateway.record_aborted(sampled, reason)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.create_task(watch())
        streaming = asyncio.create_task(self._stream(send, disconnected))
        try:
            await asyncio.wait({streaming, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not streaming.done() and not self.committing:
                streaming.cancel()  # the client left mid-stream
            await asyncio.wait({streaming})
        except asyncio.CancelledError:  # the server is stopping this request
            streaming.cancel()
            await asyncio.shield(self._abort("stream aborted: CancelledError"))
            raise
        finally:
            watcher.cancel()
        error = None if streaming.cancelled() else streaming.exception()
        if streaming.cancelled() or isinstance(error, (OSError, ConnectionError)):
            await asyncio.shield(
                self._abort(f"stream aborted: {type(error or asyncio.CancelledError()).__name__}")
            )
        elif error is not None:  # the engine failed mid-stream: the response has begun, so it just ends
            log.warning("a streamed turn failed: %r", error)
            await asyncio.shield(self._abort(f"stream failed: {error!r}"[:500]))


def build_app(
    gateway: Gateway,
    *,
    model_names: list[str],
    max_request_bytes: int = MAX_REQUEST_BYTES,
    operator: Operator | None = None,
    host: str = "127.0.0.1",
) -> Starlette:
    """The gateway's routes; with `operator`, its operator routes too (rollout.gateway.operator). `host` is
    the address it listens on: it decides the Host names it answers to."""
    chat, responses, messages = OpenAIChat(), OpenAIResponses(), AnthropicMessages()
    openapi = document(max_context=gateway.max_context)
    too_large = f"the request body is over the gateway's limit of {max_request_bytes} bytes"
    seen = SeenSeats()

    async def seat_of(request: Request) -> Seat:
        return check_seat(await resolve(gateway.ledger, token_of(request)))

    def token_of(request: Request) -> str:
        if token := _token(request):
            return token
        raise _Refused(401, "no seat token: use the seat's base URL (/s/TOKEN/v1) or send it as the API key")

    def check_seat(seat: Seat | None) -> Seat:
        if seat is None:
            raise _Refused(401, "unknown seat token: open a seat with `rollout seat new`")
        if not seat.open:
            gateway.forget(seat.seat_id)  # it takes no more turns: what was kept for it goes
            raise _Refused(410, f"seat {seat.seat_id} is finished: its episode has ended")
        return seat

    async def body_of(request: Request) -> Any:
        # Refused before anything is parsed: by the declared length, or once the streamed bytes pass the
        # limit.
        if (refusal := json_body_refusal(request.headers)) is not None:
            raise _Refused(415, refusal)
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
            except RunStopped as stopped:
                return JSONResponse(dialect.error(410, str(stopped), None), 410)
            except ExternalModelRefused as refused:
                return JSONResponse(dialect.error(403, str(refused), None), 403)
            except EngineUnavailable as busy:
                retry = str(max(1, round(busy.retry_after_s)))
                return JSONResponse(dialect.error(503, str(busy), None), 503, headers={"retry-after": retry})
            except SeatBusy as busy:
                retry = str(max(1, round(busy.retry_after_s)))
                return JSONResponse(dialect.error(429, str(busy), None), 429, headers={"retry-after": retry})

        return handle

    async def complete(request: Request, dialect: Dialect) -> Response | SSEResponse:
        try:
            parsed = dialect.parse(await body_of(request), max_context=gateway.max_context)
        except (BadRequest, _Refused):
            await seat_of(request)  # a bad seat is answered before a bad body
            raise
        # One round trip finds the seat and any turn already recorded for this request (a replay); a seat seen
        # before has its turn rendered meanwhile.
        token = token_of(request)
        lookup = asyncio.create_task(resolve_for_turn(gateway.ledger, token, gateway.turn_key(parsed)))
        await asyncio.sleep(0)  # the query is sent before the rendering takes the CPU
        known = seen.get(token)
        try:
            prepared = await gateway.prepare(known, parsed) if known is not None and known.open else None
        finally:
            found, recorded = await lookup
        seat = check_seat(found)
        seen.remember(token, seat)
        if not parsed.stream:
            turn = await gateway.complete(seat, parsed, recorded=recorded, prepared=prepared)
            return JSONResponse(dialect.response(turn))
        outcome = await gateway.stream(seat, parsed, recorded=recorded, prepared=prepared)
        return SSEResponse(gateway, outcome, dialect.writer())

    async def count_tokens(request: Request, dialect: Dialect) -> Response:
        seat = await seat_of(request)
        parsed = messages.parse(await body_of(request), count_only=True)
        return JSONResponse({"input_tokens": await gateway.count_tokens(seat, parsed)})

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

    def error(path: str, status: int, message: str) -> Response:
        dialect = messages if "/v1/messages" in path else responses if path.endswith("/responses") else chat
        return JSONResponse(dialect.error(status, message, None), status)

    operator_only = operator_routes(gateway.ledger, operator) if operator is not None else []
    return Starlette(
        routes=[
            *routes(""),
            *routes("/s/{token}"),
            Route("/health", health),
            Route("/openapi.json", openapi_json, methods=["GET"]),
            *operator_only,
        ],
        middleware=[Middleware(HostGuard, hosts=Hosts.bound_to(host), error=error)],
        exception_handlers=json_errors(error),
    )
