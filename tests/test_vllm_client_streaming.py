"""The vLLM client against a fake vLLM server (no GPU here): a small Starlette app that answers
`/v1/completions` with `stream: true` in vLLM's server-sent event format (chunks of `text_completion` with
`token_ids` or, as `--return-tokens-as-token-ids` writes them, `token_id:N` tokens; a usage chunk; `[DONE]`),
without it in one `text_completion`; with the finish reason it is told (vLLM's `abort` for what it cut short
when put to sleep), or with an error status (vLLM's 500 once its engine core is dead)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollout.engines.protocol import CheckpointNotServed, EngineError, EngineUnavailable, SampleRequest
from rollout.engines.vllm_client import VLLMEngine
from rollout.net import serving

IDS = [9707, 504, 279, 5316, 13, 151645]
LOGPROBS = [-0.5, -1.25, -0.125, -2.0, -0.75, -0.01]


class FakeVLLM:
    """Streams `IDS` one token per chunk; token k is sent only once `release(k)` let it through."""

    def __init__(
        self,
        *,
        token_ids_field: bool = True,
        fail_after: int | None = None,
        finish: str = "stop",
        status: int = 200,
        healthy: bool = False,
        failing: tuple[str, ...] = (),
    ) -> None:
        self.token_ids_field, self.fail_after = token_ids_field, fail_after
        self.finish, self.status = finish, status
        self.healthy = healthy  # /health's answer (a dead engine core's is not 200)
        self.failing = failing  # control routes that answer 500
        self.gates = [asyncio.Event() for _ in IDS]
        self.sent = 0
        self.disconnected = asyncio.Event()
        self.bodies: list[dict[str, Any]] = []
        self.calls: list[
            tuple[str, dict[str, str]]
        ] = []  # each pause, sleep, wake and resume, with its query

    def release(self, upto: int) -> None:
        for gate in self.gates[:upto]:
            gate.set()

    def app(self) -> Starlette:
        async def completions(request: Request) -> Response:
            body = await request.json()
            self.bodies.append(body)
            if body["model"] != "base":
                return JSONResponse({"error": {"message": "no such model", "type": "NotFoundError"}}, 404)
            if self.status != 200:
                message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
                return JSONResponse(
                    {"error": {"message": message, "type": "InternalServerError"}}, self.status
                )
            if not body.get("stream"):
                choice = {
                    "index": 0,
                    "text": "".join(f"t{k}" for k in range(len(IDS))),
                    "logprobs": {"token_logprobs": LOGPROBS, "tokens": [f"token_id:{t}" for t in IDS]},
                    "finish_reason": self.finish,
                    "token_ids": IDS,
                }
                return JSONResponse(
                    {"id": "cmpl-1", "object": "text_completion", "model": "base", "choices": [choice]}
                )

            async def events() -> AsyncIterator[bytes]:
                try:
                    for k, (token, logprob) in enumerate(zip(IDS, LOGPROBS, strict=True)):
                        await self.gates[k].wait()
                        if self.fail_after is not None and k == self.fail_after:
                            error = {
                                "error": {"message": "CUDA out of memory", "type": "InternalServerError"}
                            }
                            yield f"data: {json.dumps(error)}\n\n".encode()
                            break
                        choice: dict[str, Any] = {
                            "index": 0,
                            "text": f"t{k}",
                            "logprobs": {
                                "text_offset": [k],
                                "token_logprobs": [logprob],
                                "tokens": [f"token_id:{token}"],
                                "top_logprobs": [{f"token_id:{token}": logprob}],
                            },
                            "finish_reason": self.finish if k == len(IDS) - 1 else None,
                            "stop_reason": None,
                        }
                        if self.token_ids_field:
                            choice["token_ids"] = [token]
                            if k == 0:
                                choice["prompt_token_ids"] = body["prompt"]
                        chunk = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "base"}
                        yield f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n".encode()
                        self.sent += 1
                    else:
                        usage = {"prompt_tokens": 3, "completion_tokens": len(IDS), "total_tokens": 9}
                        yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n".encode()
                    yield b"data: [DONE]\n\n"
                except asyncio.CancelledError:
                    self.disconnected.set()
                    raise

            return StreamingResponse(events(), media_type="text/event-stream")

        async def unload(request: Request) -> Response:
            name = (await request.json())["lora_name"]
            message = f"The lora adapter '{name}' cannot be found."  # vLLM 0.33's words, with its 404
            return JSONResponse({"error": {"message": message, "type": "NotFoundError", "code": 404}}, 404)

        async def control(request: Request) -> Response:
            self.calls.append((request.url.path, dict(request.query_params)))
            if request.url.path in self.failing:
                return JSONResponse({"error": {"message": "CUDA error", "type": "InternalServerError"}}, 500)
            return JSONResponse({"status": "ok"})

        async def health(request: Request) -> Response:
            return Response(status_code=200 if self.healthy else 503)

        return Starlette(
            routes=[
                Route("/v1/completions", completions, methods=["POST"]),
                Route("/v1/unload_lora_adapter", unload, methods=["POST"]),
                *(
                    Route(path, control, methods=["POST"])
                    for path in ("/pause", "/sleep", "/wake_up", "/resume")
                ),
                Route("/health", health),
            ]
        )


REQUEST = SampleRequest((1, 2, 3), max_tokens=16, seed=5)


@pytest.mark.parametrize("token_ids_field", [True, False], ids=["token_ids", "token_id_strings"])
async def test_chunks_arrive_as_the_server_sends_them_with_ids_and_logprobs(token_ids_field: bool) -> None:
    fake = FakeVLLM(token_ids_field=token_ids_field)
    async with serving(fake.app()) as url:
        client = VLLMEngine(url, api_key=None)
        stream = client.stream(REQUEST)
        fake.release(1)
        first = await asyncio.wait_for(anext(stream), 5)
        assert (first.ids, first.logprobs, first.finish_reason) == ((IDS[0],), (LOGPROBS[0],), None)
        assert fake.sent == 1, "the first token reached the client while the rest were still to be sampled"
        fake.release(len(IDS))
        rest = [chunk async for chunk in stream]
        await client.close()
    assert [t for c in [first, *rest] for t in c.ids] == IDS
    assert [x for c in [first, *rest] for x in c.logprobs] == LOGPROBS
    assert rest[-1].finish_reason == "stop" and rest[-1].model == "base"
    body = fake.bodies[0]
    assert body["stream"] is True and body["prompt"] == [1, 2, 3] and body["logprobs"] == 0
    assert body["return_token_ids"] is True and body["seed"] == 5


async def test_closing_the_stream_closes_the_connection_and_errors_are_raised() -> None:
    fake = FakeVLLM()
    async with serving(fake.app()) as url:
        client = VLLMEngine(url, api_key=None)
        stream = client.stream(REQUEST)
        fake.release(2)
        await anext(stream)
        await stream.aclose()  # the reader left: vLLM learns it from the closed connection
        await asyncio.wait_for(fake.disconnected.wait(), 5)
        assert fake.sent < len(IDS)
        with pytest.raises(CheckpointNotServed):
            await anext(client.stream(SampleRequest((1,), max_tokens=2, model="ckpt-9")))
        failing = FakeVLLM(fail_after=2)
        failing.release(len(IDS))
        async with serving(failing.app()) as failing_url:
            broken = VLLMEngine(failing_url, api_key=None)
            with pytest.raises(EngineError, match="CUDA out of memory"):
                _ = [chunk async for chunk in broken.stream(REQUEST)]
            await broken.close()
        await client.close()


@pytest.mark.parametrize(
    ("reason", "raised"), [("abort", EngineUnavailable), ("error", EngineError), ("repetition", EngineError)]
)
async def test_a_completion_the_model_did_not_finish_is_never_passed_on_as_finished(
    reason: str, raised: type[Exception]
) -> None:
    """vLLM put to sleep answers what it had in flight with `abort` and partial tokens: that is no finished
    turn (it is sampled again, or recorded aborted mid-stream); a reason this client does not know is a
    failure."""
    fake = FakeVLLM(finish=reason)
    fake.release(len(IDS))
    async with serving(fake.app()) as url:
        client = VLLMEngine(url, api_key=None)
        with pytest.raises(raised, match=reason if raised is EngineError else "aborted"):
            await client.sample(REQUEST)
        streamed: list[int] = []

        async def read_to_the_end() -> None:
            async for chunk in client.stream(REQUEST):
                streamed.extend(chunk.ids)

        with pytest.raises(raised):
            await read_to_the_end()
        assert streamed == IDS[:-1], "the tokens before the end were streamed; the end was not passed on"
        finished = FakeVLLM(finish="length")
        finished.release(len(IDS))
        async with serving(finished.app()) as finished_url:
            done = VLLMEngine(finished_url, api_key=None)
            assert (await done.sample(REQUEST)).finish_reason == "length"
            await done.close()
        await client.close()


async def test_a_dead_engine_core_is_unavailable_not_a_refusal_of_the_request() -> None:
    """vLLM answers 500 once its engine core has died (its /health fails too): the gateway holds the turn
    (503) rather than failing it. A 500 from an engine whose /health answers is that request's own failure:
    retrying it would only fail again."""
    fake = FakeVLLM(status=500)
    async with serving(fake.app()) as url:
        client = VLLMEngine(url, api_key=None)
        with pytest.raises(EngineUnavailable, match="EngineCore encountered an issue"):
            await client.sample(REQUEST)
        with pytest.raises(EngineUnavailable):
            await anext(client.stream(REQUEST))
        fake.healthy = True
        with pytest.raises(EngineError, match="failed the request"):
            await client.sample(REQUEST)
        with pytest.raises(EngineError, match="failed the request"):
            await anext(client.stream(REQUEST))
        await client.close()


async def test_unloading_an_adapter_the_engine_does_not_hold_is_a_key_error() -> None:
    """What the follower takes as "already gone" (it unloads retired checkpoints, some of which a restarted
    vLLM never loaded)."""
    async with serving(FakeVLLM().app()) as url:
        client = VLLMEngine(url, api_key=None)
        with pytest.raises(KeyError, match="gone"):
            await client.unload("gone")
        await client.close()


async def test_sleep_lets_the_requests_in_flight_finish_and_refuses_new_ones_until_the_wake() -> None:
    """vLLM 0.33's /sleep takes `mode`, default `abort`, and queues what arrives while it sleeps: the client
    pauses first with `wait` (what is being generated finishes, new requests get 503), then sleeps; the wake
    resumes."""
    fake = FakeVLLM()
    async with serving(fake.app()) as url:
        client = VLLMEngine(url, api_key=None)
        await client.sleep()
        await client.wake()
        await client.close()
    assert fake.calls == [
        ("/pause", {"mode": "wait"}),
        (
            "/sleep",
            {"level": "1", "mode": "abort"},
        ),  # what the pause left queued: sampled again after the wake
        ("/wake_up", {}),
        ("/resume", {}),
    ]
    # A sleep that fails after its pause resumes the engine: never left refusing every turn.
    failing = FakeVLLM(failing=("/sleep",))
    async with serving(failing.app()) as url:
        client = VLLMEngine(url, api_key=None)
        with pytest.raises(EngineUnavailable):
            await client.sleep()
        await client.close()
    assert [path for path, _ in failing.calls] == ["/pause", "/sleep", "/resume"]
