"""A scripted engine over HTTP for the gateway benchmark: the same fixed reply in two dialects.

`/v1/completions` answers in vLLM's dialect (token ids and logprobs; what rollout's gateway calls) and
`/v1/chat/completions` in OpenAI's (what LiteLLM's proxy and the direct baseline call). Both do the same trivial
work, so the difference between the paths in front of it is the cost of the path.
Run: `python -m benchmarks.scripted_backend --port P --ids 1,2,3`.
"""

from __future__ import annotations

import argparse
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

REPLY = "Hello from the script."


def build(completion_ids: list[int]) -> Starlette:
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        ids = completion_ids[: body.get("max_tokens") or len(completion_ids)]
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

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
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
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
