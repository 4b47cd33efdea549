"""A FAKE Tinker service: the wire protocol of Tinker's hosted API, answered by a local rollout engine.

Tinker's API cannot be reached from CI, so rollout's Tinker code is tested against this fake. It speaks what
the real `tinker` SDK sends and expects (JSON requests; the `SampleResponse` protobuf the SDK ships, when the
SDK asks for it with `Accept: application/x-protobuf`), and samples with whatever `Engine` it is given (the
local engine with a tiny model in tests). It is not Tinker: no queueing model, no billing. Given a
`FakeTinkerTraining` it also answers training clients (`rollout_testing.tinker_training`). A live test runs
against the real service when `TINKER_API_KEY` is set.

Contract:
- Every request must carry `X-API-Key` equal to the fake's key (401 otherwise), as the real API demands.
- Sampler paths `tinker://…/sampler_weights/NAME` sample the engine's model `NAME` (which the caller made
  servable with `register_sampler`); a base-model sampling session samples the engine's served base weights.
- `asample` answers a promise at once; `retrieve_future` waits (up to `long_poll_s`) for the result and
  answers `try_again` while it is still running, as the real service does.
- Training requests of one model run one after another, in the order they arrive (the SDK sends them in
  `seq_id` order), each answered through `retrieve_future` like a sample (JSON results).
- Requests it does not know answer 404 in Tinker's error shape and are kept in `unknown_routes`, so a test
  sees when the SDK starts calling something new.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollout.engines.protocol import CheckpointRef, Engine, EngineUnavailable, SampleRequest, SampleResult
from rollout_testing.tinker_training import FakeTinkerTraining, FakeTinkerUserError

SAMPLER_PREFIX = "tinker://"
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass
class _SamplingSession:
    base_model: str
    model_path: str | None
    engine_model: str


@dataclass
class FakeTinkerState:
    api_key: str
    base_model: str
    engine: Engine
    served_name: str = "base"
    long_poll_s: float = 20.0
    samplers: dict[str, str] = field(default_factory=dict[str, str])
    sessions: set[str] = field(default_factory=set[str])
    sampling_sessions: dict[str, _SamplingSession] = field(default_factory=dict[str, _SamplingSession])
    training: FakeTinkerTraining | None = None
    futures: dict[str, asyncio.Task[Any]] = field(default_factory=dict[str, asyncio.Task[Any]])
    model_queues: dict[str, asyncio.Task[Any]] = field(default_factory=dict[str, asyncio.Task[Any]])
    unknown_routes: list[str] = field(default_factory=list[str])
    samples_served: int = 0


def sampler_path(run: str, name: str) -> str:
    """The sampler path Tinker gives a checkpoint saved for sampling."""
    return f"{SAMPLER_PREFIX}{run}/sampler_weights/{name}"


async def register_sampler(state: FakeTinkerState, path: str, checkpoint: CheckpointRef) -> None:
    """Make `path` sample `checkpoint` (loaded into the backing engine), as `save_weights_for_sampler`
    would."""
    await state.engine.load(checkpoint)
    state.samplers[path] = checkpoint.name


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def _sample_response_proto(result: SampleResult) -> bytes:
    from tinker.proto import tinker_public_pb2 as public_pb

    stop = public_pb.STOP_REASON_STOP if result.finish_reason == "stop" else public_pb.STOP_REASON_LENGTH
    sequence = public_pb.SampledSequence(
        stop_reason=stop,
        tokens=np.asarray(result.completion_ids, dtype=np.int32).tobytes(),
        logprobs=np.asarray(result.logprobs, dtype=np.float32).tobytes(),
    )
    return public_pb.SampleResponse(sequences=[sequence]).SerializeToString()


def _stop_token_ids(stop: Any) -> tuple[int, ...]:
    if stop is None:
        return ()
    if isinstance(stop, list) and all(isinstance(t, int) for t in stop):
        return tuple(stop)
    raise ValueError("the fake Tinker service supports stop token ids only, not stop strings")


def build_app(state: FakeTinkerState) -> Starlette:
    async def body_of(request: Request) -> dict[str, Any]:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        return body

    async def client_config(request: Request) -> Response:
        # API-key auth and plain httpx: the flags a self-hosted deployment would send.
        return JSONResponse(
            {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "sample_use_retrieve_futures": False}
        )

    async def dynamic_config(request: Request) -> Response:
        return JSONResponse({})

    async def create_session(request: Request) -> Response:
        session_id = f"fake-session-{uuid.uuid4().hex[:12]}"
        state.sessions.add(session_id)
        return JSONResponse({"type": "create_session", "session_id": session_id})

    async def heartbeat(request: Request) -> Response:
        body = await body_of(request)
        if body.get("session_id") not in state.sessions:
            return _error(410, "session finished")
        return JSONResponse({"type": "session_heartbeat"})

    async def create_sampling_session(request: Request) -> Response:
        body = await body_of(request)
        model_path, base_model = body.get("model_path"), body.get("base_model")
        if model_path is not None:
            if model_path not in state.samplers:
                return _error(404, f"no sampler weights at {model_path}")
            engine_model = state.samplers[model_path]
        elif base_model == state.base_model:
            engine_model = state.served_name
        else:
            return _error(400, f"base model {base_model!r} is not served here (only {state.base_model!r})")
        session_id = f"fake-sampler-{uuid.uuid4().hex[:12]}"
        state.sampling_sessions[session_id] = _SamplingSession(state.base_model, model_path, engine_model)
        return JSONResponse({"type": "create_sampling_session", "sampling_session_id": session_id})

    async def get_sampler(request: Request) -> Response:
        session = state.sampling_sessions.get(request.path_params["sampler_id"])
        if session is None:
            return _error(404, "no such sampler")
        return JSONResponse(
            {
                "sampler_id": request.path_params["sampler_id"],
                "base_model": session.base_model,
                "model_path": session.model_path,
            }
        )

    async def asample(request: Request) -> Response:
        body = await body_of(request)
        session = state.sampling_sessions.get(str(body.get("sampling_session_id")))
        if session is None:
            return _error(404, "unknown sampling session")
        if body.get("num_samples", 1) != 1:
            return _error(400, "the fake Tinker service samples one sequence per request")
        params = body.get("sampling_params") or {}
        prompt_ids: list[int] = []
        for chunk in body["prompt"]["chunks"]:
            if chunk.get("type") != "encoded_text":
                return _error(
                    400, f"the fake Tinker service takes token chunks only, not {chunk.get('type')}"
                )
            prompt_ids.extend(int(t) for t in chunk["tokens"])
        try:
            stop_ids = _stop_token_ids(params.get("stop"))
        except ValueError as error:
            return _error(400, str(error))
        sample = SampleRequest(
            prompt_ids=tuple(prompt_ids),
            max_tokens=int(params.get("max_tokens") or 16),
            model=session.engine_model,
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            stop_token_ids=stop_ids,
            seed=params.get("seed"),
        )
        request_id = f"fake-future-{uuid.uuid4().hex}"
        state.futures[request_id] = asyncio.create_task(state.engine.sample(sample))
        return JSONResponse({"request_id": request_id, "sample_sequence_ids": [f"{request_id}/0"]})

    async def retrieve_future(request: Request) -> Response:
        body = await body_of(request)
        request_id = str(body.get("request_id"))
        task = state.futures.get(request_id)
        if task is None:
            return _error(404, f"unknown request {request_id}")
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=state.long_poll_s)
        except TimeoutError:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        except EngineUnavailable as error:
            state.futures.pop(request_id, None)
            return JSONResponse({"error": str(error), "category": "server"})
        except FakeTinkerUserError as error:
            state.futures.pop(request_id, None)
            return JSONResponse({"error": str(error), "category": "user"})
        except Exception as error:
            state.futures.pop(request_id, None)
            return JSONResponse({"error": f"{type(error).__name__}: {error}", "category": "user"})
        state.futures.pop(request_id, None)
        result = task.result()
        if isinstance(result, bytes):  # a protobuf answer (ForwardBackwardOutput)
            return Response(result, media_type="application/x-protobuf")
        if not isinstance(result, SampleResult):
            return JSONResponse(result)
        state.samples_served += 1
        return Response(_sample_response_proto(result), media_type="application/x-protobuf")

    async def finish_session(request: Request) -> Response:
        state.sessions.discard(request.path_params["session_id"])
        return JSONResponse({})

    async def telemetry(request: Request) -> Response:
        return JSONResponse({"status": "accepted"})

    async def cancel(request: Request) -> Response:
        body = await body_of(request)
        task = state.futures.pop(str(body.get("request_id")), None)
        if task is not None:
            task.cancel()
        return JSONResponse({})

    async def unknown(request: Request) -> Response:
        state.unknown_routes.append(f"{request.method} {request.url.path}")
        return _error(404, f"the fake Tinker service does not implement {request.url.path}")

    routes: list[Route] = [
        Route("/api/v1/client/config", client_config, methods=["POST"]),
        Route("/api/v1/client/dynamic_config", dynamic_config, methods=["POST"]),
        Route("/api/v1/create_session", create_session, methods=["POST"]),
        Route("/api/v1/session_heartbeat", heartbeat, methods=["POST"]),
        Route("/api/v1/create_sampling_session", create_sampling_session, methods=["POST"]),
        Route("/api/v1/samplers/{sampler_id}", get_sampler, methods=["GET"]),
        Route("/api/v1/asample", asample, methods=["POST"]),
        Route("/api/v1/retrieve_future", retrieve_future, methods=["POST"]),
        Route("/api/v1/sessions/{session_id}/finish", finish_session, methods=["POST"]),
        Route("/api/v1/telemetry", telemetry, methods=["POST"]),
        Route("/api/v1/cancel_future", cancel, methods=["POST"]),
    ]
    if state.training is not None:
        routes += training_routes(state, state.training)
    routes.append(Route("/{path:path}", unknown, methods=["GET", "POST", "PUT", "DELETE"]))
    return Starlette(routes=[Route(r.path, _checked(state, r.endpoint), methods=r.methods) for r in routes])


def training_routes(state: FakeTinkerState, training: FakeTinkerTraining) -> list[Route]:
    """Training clients: each request becomes a future, run after the model's previous request."""

    def promise(model_id: str, work: Callable[[], Any]) -> Response:
        previous = state.model_queues.get(model_id)

        async def run() -> Any:
            if previous is not None:
                with contextlib.suppress(Exception):
                    await previous
            return await asyncio.to_thread(work)

        task = asyncio.create_task(run())
        state.model_queues[model_id] = state.futures[request_id := f"fake-future-{uuid.uuid4().hex}"] = task
        return JSONResponse({"request_id": request_id})

    async def create_model(request: Request) -> Response:
        body = await request.json()
        if body["base_model"] != state.base_model:
            return _error(
                400, f"base model {body['base_model']!r} is not trained here (only {state.base_model!r})"
            )
        lora = body.get("lora_config") or {}
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"

        def create() -> dict[str, Any]:
            training.create_model(model_id, int(lora.get("rank", 32)), lora.get("seed"))
            return {"model_id": model_id, "type": "create_model"}

        return promise(model_id, create)

    async def forward_backward(request: Request) -> Response:
        from tinker.proto import tinker_public_pb2 as public_pb

        if request.headers.get("content-encoding") == "zstd":
            return _error(
                400, "the fake Tinker service takes uncompressed protobuf (its client config says so)"
            )
        message = public_pb.ForwardBackwardRequest()
        message.ParseFromString(await request.body())
        model_id = message.model_id
        training.model(model_id)
        return promise(
            model_id, lambda: training.forward_backward(model_id, message, forward_only=message.forward_only)
        )

    async def optim_step(request: Request) -> Response:
        body = await request.json()
        model_id = str(body["model_id"])
        training.model(model_id)
        params = body.get("adam_params") or body.get("optim_params") or {}
        return promise(model_id, lambda: training.optim_step(model_id, params))

    async def save_weights(request: Request) -> Response:
        body = await request.json()
        model_id, name = str(body["model_id"]), str(body.get("path") or f"state-{uuid.uuid4().hex[:8]}")

        def save() -> dict[str, Any]:
            return {"path": training.save(model_id, name, for_sampler=False)[0], "type": "save_weights"}

        return promise(model_id, save)

    async def save_weights_for_sampler(request: Request) -> Response:
        body = await request.json()
        model_id = str(body["model_id"])
        if not body.get("path"):
            return _error(400, "the fake Tinker service saves named sampler weights only (give a name)")
        name = str(body["path"])
        loop = asyncio.get_running_loop()

        def save() -> dict[str, Any]:
            path, folder = training.save(model_id, name, for_sampler=True)
            engine_name = f"tinker-{model_id}-{name}"
            asyncio.run_coroutine_threadsafe(
                register_sampler(state, path, CheckpointRef(engine_name, str(folder))), loop
            ).result()
            return {"path": path, "type": "save_weights_for_sampler"}

        return promise(model_id, save)

    async def load_weights(request: Request) -> Response:
        body = await request.json()
        path = str(body["path"])
        training.folder(path)
        new = body.get("model_id") is None  # a new training client from a saved state
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}" if new else str(body["model_id"])

        def load() -> dict[str, Any]:
            if new:
                training.create_model(model_id, training.saved_rank(path))
            training.load(model_id, path, optimizer=bool(body.get("optimizer")))
            return {"path": path, "model_id": model_id, "type": "load_weights"}

        return promise(model_id, load)

    async def get_info(request: Request) -> Response:
        body = await request.json()
        held = training.model(str(body["model_id"]))
        return JSONResponse(
            {
                "type": "get_info",
                "model_id": held.model_id,
                "is_lora": True,
                "lora_rank": held.rank,
                "model_name": state.base_model,
                "model_data": {
                    "arch": "qwen3",
                    "model_name": state.base_model,
                    "tokenizer_id": state.base_model,
                },
            }
        )

    return [
        Route("/api/v1/create_model", create_model, methods=["POST"]),
        Route("/api/v1/forward_backward", forward_backward, methods=["POST"]),
        Route("/api/v1/optim_step", optim_step, methods=["POST"]),
        Route("/api/v1/save_weights", save_weights, methods=["POST"]),
        Route("/api/v1/save_weights_for_sampler", save_weights_for_sampler, methods=["POST"]),
        Route("/api/v1/load_weights", load_weights, methods=["POST"]),
        Route("/api/v1/get_info", get_info, methods=["POST"]),
    ]


def _checked(state: FakeTinkerState, handler: Endpoint) -> Endpoint:
    """The handler behind the real API's key check, with malformed bodies answered 400."""

    async def endpoint(request: Request) -> Response:
        if request.headers.get("x-api-key") != state.api_key:
            return _error(401, "invalid API key")
        try:
            return await handler(request)
        except FakeTinkerUserError as error:
            return _error(400, str(error))
        except (ValueError, KeyError, TypeError) as error:
            return _error(400, f"malformed request: {error}")

    return endpoint


@contextmanager
def serving(state: FakeTinkerState, *, host: str = "127.0.0.1") -> Iterator[str]:
    """Run the fake on a free port, on a thread of its own, for the block; yields its base URL."""
    import uvicorn

    from rollout.net import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="fake-tinker", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the fake Tinker service did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
