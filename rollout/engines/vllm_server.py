"""An engine (the local one, or Tinker) behind the subset of vLLM's HTTP dialect that rollout uses.

Routes (shapes as vLLM's OpenAI-compatible server answers them):
- `POST /v1/completions` with a token-id `prompt`, `logprobs` (0 = the sampled token's logprob) and
  `return_token_ids`: choices carry `token_ids`, `prompt_token_ids` and `logprobs.token_logprobs`. With
  `stream: true` it answers with server-sent events as vLLM does: one `text_completion` chunk per batch of
  tokens the engine hands out (`token_ids`, `logprobs` and `text` of those tokens; `prompt_token_ids` on the
  first; `finish_reason` on the last), a usage chunk when `stream_options.include_usage`, then `data: [DONE]`.
  Usage carries `prompt_tokens_details.cached_tokens` (the prompt tokens the engine's prefix cache held), as
  vLLM's does with `--enable-prompt-tokens-details`.
  An error before the first token is an ordinary error response; one after it is a `data: {"error": ...}`
  event. A client that disconnects stops the generation.
- `POST /v1/load_lora_adapter` `{lora_name, lora_path}`, `POST /v1/unload_lora_adapter` `{lora_name}`.
- `POST /pause` (any `mode`: the batch in flight finishes) refuses new completions with vLLM's retryable 503
  until `POST /resume` or `POST /wake_up`; `GET /is_paused`.
- `POST /sleep?level=1` (any `mode`: the engine always lets its batch in flight finish), `POST /wake_up`,
  `GET /is_sleeping`, `GET /health`, `GET /v1/models`.
- `GET /metrics`: Prometheus text under vLLM's own names, so one reader serves both engines:
  `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (prompt tokens looked up in the prefix
  cache, and found), `vllm:num_requests_running` and `vllm:num_requests_waiting`; an engine keeping no prefix
  cache (turned off, a model none can share, an engine kind that has none) says why in
  `rollout:prefix_cache_off{reason=...}`.

Before any route: a request whose `Host` the server does not answer to (`Hosts.bound_to(host)`,
rollout.security.http_guard: listening on loopback, loopback's own names only, so a DNS-rebinding page is
refused; beyond it, any) → 421. Then a request to any path but `/health` without the engine API key
(`api_key`, rollout.serving.keys.engine_api_key) as `Authorization: Bearer <key>` → 401 (`WWW-Authenticate:
Bearer`; the key is compared in constant time), whatever the bind address: no one who reaches the port but the
gateway and the follower samples, loads or unloads an adapter, pauses or puts the engine to sleep. vLLM's own
`--api-key` check answers `{"error": "Unauthorized"}`; this one answers in the shape below, type
`UnauthorizedError` (rollout's client reads both). A load or unload whose body is not a JSON object with the
names it takes → 400. Every POST route refuses a body not declared `application/json` (and a body-less one
from a web page, by its `Origin`) with 415: a page cannot load, unload, pause or put the engine to sleep by a
cross-origin form post. A path no route serves → 404, a method a route does not take → 405, a body over a
limit → 413. Every error answers in vLLM's (OpenAI's) error shape: `{"error": {"message", "type", "code"}}`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol, cast

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollout.engines.protocol import (
    CheckpointRef,
    Engine,
    EngineError,
    EngineUnavailable,
    SampleChunk,
    SampleRequest,
    stream_sample,
)
from rollout.security.http_guard import BearerKey, HostGuard, Hosts, JsonBodies, json_errors


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class ServedEngine(Engine, Protocol):
    """What the server needs beyond the engine protocol: names, a tokenizer for text fields, unloading."""

    served_name: str
    sleeping: bool
    model_path: str

    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def models(self) -> list[str]: ...
    async def unload(self, name: str) -> None: ...


_ERROR_KINDS = {
    401: "UnauthorizedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    421: "MisdirectedRequestError",
}


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _refused(path: str, status: int, message: str) -> JSONResponse:
    """A refusal before any route acted (rollout.security.http_guard), in vLLM's shape."""
    return _error(status, message, _ERROR_KINDS.get(status, "BadRequestError"))


class _BadRequest(ValueError):
    pass


async def _json_object(request: Request) -> dict[str, Any]:
    """The request's body, which must be a JSON object."""
    try:
        body = await request.json()
    except ValueError as error:
        raise _BadRequest("the body is not valid JSON") from error
    if not isinstance(body, dict):
        raise _BadRequest("the body must be a JSON object")
    return cast(dict[str, Any], body)


def _field[T](body: dict[str, Any], name: str, kind: type[T] | tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    wrong_type = value is not None and not isinstance(value, kind)
    if wrong_type or (isinstance(value, bool) and kind in (int, float)):
        raise _BadRequest(f"'{name}' has the wrong type")
    return value


def _sample_request(body: dict[str, Any], engine: ServedEngine) -> SampleRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        if len(prompt) != 1:
            raise _BadRequest("'prompt' may hold one token-id list")
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt = engine.tokenizer.encode(prompt, add_special_tokens=False)
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
        raise _BadRequest("'prompt' must be a non-empty list of token ids (or a string)")
    if _field(body, "n", int, 1) != 1:
        raise _BadRequest("'n' must be 1")
    stop_ids = _field(body, "stop_token_ids", list, []) or []
    return SampleRequest(
        prompt_ids=tuple(prompt),
        max_tokens=_field(body, "max_tokens", int, 16) or 16,
        model=_field(body, "model", str, engine.served_name) or engine.served_name,
        temperature=float(_field(body, "temperature", (int, float), 1.0) or 0.0),
        top_p=float(_field(body, "top_p", (int, float), 1.0) or 1.0),
        stop_token_ids=tuple(int(t) for t in stop_ids),
        seed=_field(body, "seed", int, None),
    )


def _refusal(error: Exception) -> JSONResponse | None:
    """The error response for what an engine raises when it refuses a request; None for anything else."""
    if isinstance(error, EngineUnavailable):
        return _error(503, str(error), "ServiceUnavailableError")
    if isinstance(error, KeyError):
        return _error(404, str(error.args[0]), "NotFoundError")
    if isinstance(error, (ValueError, EngineError)):
        return _error(400, str(error))
    return None


def _logprobs(
    engine: ServedEngine, ids: tuple[int, ...], logprobs: tuple[float, ...], start: int = 0
) -> dict[str, Any]:
    """vLLM's `logprobs` of a completion asked with `logprobs: 0`: each sampled token's text, its logprob, the
    one-entry top list and its offset in the completion's text."""
    tokens = [engine.tokenizer.decode([t]) for t in ids]
    offsets = [start + sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
    return {
        "text_offset": offsets,
        "token_logprobs": list(logprobs),
        "tokens": tokens,
        "top_logprobs": [{token: logprob} for token, logprob in zip(tokens, logprobs, strict=True)],
    }


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _streamed(
    engine: ServedEngine, body: dict[str, Any], request: SampleRequest
) -> Response | StreamingResponse:
    """Start the engine's stream; an error before its first chunk is answered as an ordinary error."""
    chunks = stream_sample(engine, request)
    try:
        first = await anext(chunks)
    except Exception as error:
        if (refused := _refusal(error)) is not None:
            return refused
        raise
    completion_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    usage = isinstance(body.get("stream_options"), dict) and bool(body["stream_options"].get("include_usage"))

    async def events() -> AsyncIterator[bytes]:
        sent_ids: list[int] = []
        sent_text = ""
        chunk: SampleChunk | None = first
        model = request.model
        cached_tokens = 0
        try:
            while chunk is not None:
                sent_ids += chunk.ids
                # The text of these tokens: what the whole decodes to, less what was sent (a token that ends
                # inside a character waits for the rest of it).
                text = engine.tokenizer.decode(sent_ids, skip_special_tokens=True)
                if text.endswith("\ufffd") and chunk.finish_reason is None:
                    text = text.rstrip("\ufffd")
                delta = text[len(sent_text) :] if text.startswith(sent_text) else ""
                sent_text = text if text.startswith(sent_text) else sent_text
                model = chunk.model or model
                cached_tokens = chunk.cached_tokens or cached_tokens
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": delta,
                    "logprobs": None,
                    "finish_reason": chunk.finish_reason,
                    "stop_reason": None,
                }
                if body.get("logprobs") is not None:
                    choice["logprobs"] = _logprobs(
                        engine, chunk.ids, chunk.logprobs, start=len(sent_text) - len(delta)
                    )
                if body.get("return_token_ids"):
                    choice["token_ids"] = list(chunk.ids)
                    if len(sent_ids) == len(chunk.ids):
                        choice["prompt_token_ids"] = list(request.prompt_ids)
                yield _sse(
                    {
                        "id": completion_id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [choice],
                    }
                )
                if chunk.finish_reason is not None:
                    break
                chunk = await anext(chunks, None)
            if usage:
                yield _sse(
                    {
                        "id": completion_id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(request, len(sent_ids), cached_tokens),
                    }
                )
        except Exception as error:  # mid-stream, as vLLM reports it: an error event, then the end
            yield _sse({"error": {"message": str(error), "type": type(error).__name__, "code": 500}})
        finally:
            await chunks.aclose()  # a client gone mid-stream stops the engine's generation
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _usage(request: SampleRequest, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """A completion's usage, as vLLM reports it with `--enable-prompt-tokens-details`."""
    prompt_tokens = len(request.prompt_ids)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def prometheus_text(engine: object) -> str:
    """The engine's load and prefix-cache counters in Prometheus's text format, under vLLM's names."""
    labels = f'model_name="{_label(str(getattr(engine, "served_name", "")))}"'
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, exported: str | None = None, extra: str = "") -> None:
        lines.extend((f"# TYPE {name} {kind}", f"{exported or name}{{{labels}{extra}}} {float(value)}"))

    metric("vllm:num_requests_running", "gauge", getattr(engine, "running", 0))
    metric("vllm:num_requests_waiting", "gauge", getattr(engine, "waiting", 0))
    cache = getattr(engine, "prefix_cache", None)
    if cache is not None:
        metric("vllm:prefix_cache_queries", "counter", cache.queried, "vllm:prefix_cache_queries_total")
        metric("vllm:prefix_cache_hits", "counter", cache.reused, "vllm:prefix_cache_hits_total")
    off = getattr(engine, "prefix_cache_off", None)
    if not hasattr(engine, "prefix_cache"):  # Tinker's, a scripted one: nothing to say but that
        off = f"the {getattr(engine, 'name', 'served')} engine keeps none"
    if off is not None:
        metric("rollout:prefix_cache_off", "gauge", 1, extra=f',reason="{_label(str(off))}"')
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def build_app(engine: ServedEngine, *, api_key: str, host: str = "127.0.0.1") -> Starlette:
    """The server of `engine`; every route but `/health` needs `api_key`
    (rollout.serving.keys.engine_api_key). `host` is the address it listens on: it decides the Host names it
    answers to."""
    if not api_key:
        raise ValueError("the engine server needs an API key: without one, anyone who reaches it drives it")
    paused = False

    async def completions(request: Request) -> Response:
        if paused:  # vLLM's words and status for a request that arrives while it is paused
            return _error(
                503, "Generation is paused. Please retry after it resumes.", "ServiceUnavailableError"
            )
        try:
            body = await _json_object(request)
            sample_request = _sample_request(body, engine)
        except _BadRequest as error:
            return _error(400, str(error))
        except ValueError as error:  # a field that does not convert (a stop token id that is no number)
            return _error(400, f"the body does not describe a completion: {error}")
        if body.get("stream"):
            return await _streamed(engine, body, sample_request)
        try:
            result = await engine.sample(sample_request)
        except Exception as error:
            if (refused := _refusal(error)) is not None:
                return refused
            raise
        logprobs = None
        if body.get("logprobs") is not None:
            logprobs = _logprobs(engine, result.completion_ids, result.logprobs)
        choice: dict[str, Any] = {
            "index": 0,
            "text": engine.tokenizer.decode(list(result.completion_ids), skip_special_tokens=True),
            "logprobs": logprobs,
            "finish_reason": result.finish_reason,
            "stop_reason": None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = list(result.completion_ids)
            choice["prompt_token_ids"] = list(sample_request.prompt_ids)
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": result.model,
                "choices": [choice],
                "usage": _usage(sample_request, len(result.completion_ids), result.cached_tokens),
            }
        )

    async def load_lora(request: Request) -> Response:
        try:
            body = await _json_object(request)
        except _BadRequest as error:
            return _error(400, str(error))
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            return _error(400, "'lora_name' and 'lora_path' are required strings")
        try:
            await engine.load(CheckpointRef(name, path))
        except (OSError, ValueError, EngineError) as error:
            return _error(400, f"could not load LoRA adapter {name!r} from {path}: {error}")
        return Response(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(request: Request) -> Response:
        try:
            body = await _json_object(request)
        except _BadRequest as error:
            return _error(400, str(error))
        name = body.get("lora_name")
        if not isinstance(name, str):
            return _error(400, "'lora_name' is a required string")
        try:
            await engine.unload(name)
        except KeyError as error:
            return _error(404, str(error.args[0]), "NotFoundError")
        return Response(f"Success: LoRA adapter '{name}' removed successfully.")

    async def sleep(request: Request) -> Response:
        await engine.sleep()
        return Response()

    async def wake_up(request: Request) -> Response:
        nonlocal paused
        await engine.wake()
        paused = False
        return Response()

    async def pause(request: Request) -> Response:
        nonlocal paused
        paused = True
        return JSONResponse({"status": "paused"})

    async def resume(request: Request) -> Response:
        nonlocal paused
        paused = False
        return JSONResponse({"status": "resumed"})

    async def is_paused(request: Request) -> Response:
        return JSONResponse({"is_paused": paused})

    async def is_sleeping(request: Request) -> Response:
        return JSONResponse({"is_sleeping": engine.sleeping})

    async def health(request: Request) -> Response:
        return Response(status_code=200 if await engine.health() else 503)

    async def metrics(request: Request) -> Response:
        return Response(prometheus_text(engine), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(request: Request) -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "rollout",
                "root": engine.model_path,
                "parent": None if name == engine.served_name else engine.served_name,
            }
            for name in engine.models
        ]
        return JSONResponse({"object": "list", "data": data})

    json_only = [Middleware(JsonBodies, error=_refused)]
    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"], middleware=json_only),
            Route("/v1/load_lora_adapter", load_lora, methods=["POST"], middleware=json_only),
            Route("/v1/unload_lora_adapter", unload_lora, methods=["POST"], middleware=json_only),
            Route("/sleep", sleep, methods=["POST"], middleware=json_only),
            Route("/wake_up", wake_up, methods=["POST"], middleware=json_only),
            Route("/pause", pause, methods=["POST"], middleware=json_only),
            Route("/resume", resume, methods=["POST"], middleware=json_only),
            Route("/is_paused", is_paused, methods=["GET"]),
            Route("/is_sleeping", is_sleeping, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        middleware=[
            Middleware(HostGuard, hosts=Hosts.bound_to(host), error=_refused),
            Middleware(BearerKey, key=api_key, error=_refused, named="the engine API key"),
        ],
        exception_handlers=json_errors(_refused),
    )
