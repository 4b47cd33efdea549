"""A scripted engine over HTTP for the gateway benchmark: the same fixed reply in two dialects.

`/v1/completions` answers in vLLM's dialect (token ids and logprobs; what rollout's gateway calls) and
`/v1/chat/completions` in OpenAI's (what LiteLLM's proxy and the direct baseline call). Both do the same
trivial work, so the difference between the paths in front of it is the cost of the path. Asked to stream,
both send one chunk per token, each `TOKEN_S` after the one before (a stand-in for decoding time), in their
dialect's server-sent events. Run: `python -m benchmarks.scripted_backend --port P --ids 1,2,3`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

REPLY = "Hello from the script."
TOKEN_S = 0.01


def _event(data: object) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _pieces(n: int) -> list[str]:
    """REPLY in n pieces, one per token (the last token, the end of turn, has no text)."""
    cut = [round(i * len(REPLY) / max(1, n - 1)) for i in range(n)]
    return [REPLY[a:b] for a, b in itertools.pairwise(cut)] + [""]


def build(completion_ids: list[int]) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        ids = completion_ids[: body.get("max_tokens") or len(completion_ids)]
        if body.get("stream"):

            async def vllm_events() -> AsyncIterator[bytes]:
                for k, (token, text) in enumerate(zip(ids, _pieces(len(ids)), strict=True)):
                    await asyncio.sleep(TOKEN_S)
                    choice = {
                        "index": 0,
                        "text": text,
                        "logprobs": {
                            "token_logprobs": [0.0],
                            "tokens": [f"token_id:{token}"],
                            "top_logprobs": None,
                        },
                        "finish_reason": "stop" if k == len(ids) - 1 else None,
                        "stop_reason": None,
                        "token_ids": [token],
                    }
                    chunk = {
                        "id": "cmpl-1",
                        "object": "text_completion",
                        "created": 0,
                        "model": body.get("model"),
                    }
                    yield _event({**chunk, "choices": [choice]})
                yield b"data: [DONE]\n\n"

            return StreamingResponse(vllm_events(), media_type="text/event-stream")
        choice = {
            "index": 0,
            "text": REPLY,
            "finish_reason": "stop",
            "token_ids": ids,
            "logprobs": {"token_logprobs": [0.0] * len(ids), "tokens": [], "top_logprobs": None},
        }
        return JSONResponse(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model", "base"),
                "choices": [choice],
            }
        )

    async def chat(request: Request) -> Response:
        body = await request.json()
        if body.get("stream"):

            async def chat_events() -> AsyncIterator[bytes]:
                base = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body.get("model"),
                }
                yield _event(
                    {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
                )
                pieces = _pieces(len(completion_ids))
                for k, text in enumerate(pieces):
                    await asyncio.sleep(TOKEN_S)
                    finish = "stop" if k == len(pieces) - 1 else None
                    delta = {"content": text} if text else {}
                    yield _event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chat_events(), media_type="text/event-stream")
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}
                ],
                "usage": {
                    "prompt_tokens": 10,
                    "completion_tokens": len(completion_ids),
                    "total_tokens": 10 + len(completion_ids),
                },
            }
        )

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", health),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ids", required=True, help="comma-separated completion token ids")
    args = parser.parse_args()
    app = build([int(x) for x in args.ids.split(",")])
    # Keep-alive longer than any pause of a loaded client: a server closing an idle connection as the client
    # reuses it is a read error on the client, not a measurement.
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, timeout_keep_alive=60
    )


if __name__ == "__main__":
    main()
