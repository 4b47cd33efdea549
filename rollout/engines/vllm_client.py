"""An engine reached over vLLM's HTTP dialect: a real `vllm serve`, or rollout's local engine server.

Contract: maps the engine protocol onto `/v1/completions` with token-id prompts, `logprobs=0` and
`return_token_ids`, and onto the LoRA, sleep and health routes. A connection failure, a 503, a timeout or a
completion for a model the engine does not serve (404) raise `EngineUnavailable`; any other error response
raises `EngineError` with the server's message.

The engine hop is on every turn's path, so it uses aiohttp's client (keep-alive, one session per event loop):
it costs a fraction of httpx's per-request CPU, which on a small machine is most of the gateway's added latency.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from rollout.engines.protocol import (
    CheckpointNotServed,
    CheckpointRef,
    EngineError,
    EngineUnavailable,
    SampleRequest,
    SampleResult,
)

__all__ = ["EngineError", "VLLMEngine"]


class _Answer:
    def __init__(self, status: int, headers: Any, text: str) -> None:
        self.status, self.headers, self.text = status, headers, text

    def json(self) -> Any:
        return json.loads(self.text)


class VLLMEngine:
    def __init__(self, base_url: str, *, name: str = "vllm", timeout_s: float = 600) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                self.base_url, timeout=self._timeout, connector=aiohttp.TCPConnector(limit=0)
            )
            self._session_loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(
        self, method: str, path: str, payload: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> _Answer:
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None
        try:
            async with self._client().request(method, path, json=payload, timeout=timeout) as response:
                return _Answer(response.status, response.headers, await response.text())
        except (aiohttp.ClientConnectionError, TimeoutError) as error:
            raise EngineUnavailable(f"engine at {self.base_url} is unreachable: {error!r}") from error

    async def _post(self, path: str, payload: dict[str, Any] | None = None) -> _Answer:
        answer = await self._request("POST", path, payload)
        self._check(answer, path=path)
        return answer

    def _check(self, answer: _Answer, *, path: str = "") -> None:
        if answer.status == 404 and path == "/v1/completions":
            raise CheckpointNotServed(f"engine at {self.base_url} does not serve that model: {answer.text}")
        if answer.status == 503:
            retry = float(answer.headers.get("retry-after", "1"))
            raise EngineUnavailable(f"engine at {self.base_url} is unavailable: {answer.text}", retry)
        if answer.status >= 400:
            try:
                message = answer.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = answer.text
            raise EngineError(f"engine at {self.base_url} answered {answer.status}: {message}")

    async def sample(self, request: SampleRequest) -> SampleResult:
        payload: dict[str, Any] = {
            "model": request.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": list(request.stop_token_ids),
        }
        if request.seed is not None:
            payload["seed"] = request.seed
        body = (await self._post("/v1/completions", payload)).json()
        choice = body["choices"][0]
        ids = tuple(int(t) for t in choice["token_ids"])
        logprobs = tuple(float(x) for x in choice["logprobs"]["token_logprobs"])
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return SampleResult(
            completion_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            model=body.get("model", request.model),
        )

    async def load(self, checkpoint: CheckpointRef) -> None:
        await self._post(
            "/v1/load_lora_adapter", {"lora_name": checkpoint.name, "lora_path": checkpoint.path}
        )

    async def unload(self, name: str) -> None:
        await self._post("/v1/unload_lora_adapter", {"lora_name": name})

    async def sleep(self) -> None:
        await self._post("/sleep?level=1")

    async def wake(self) -> None:
        await self._post("/wake_up")

    async def health(self) -> bool:
        try:
            return (await self._request("GET", "/health", timeout_s=5)).status == 200
        except EngineUnavailable:
            return False

    async def models(self) -> list[str]:
        answer = await self._request("GET", "/v1/models")
        self._check(answer)
        return [entry["id"] for entry in answer.json()["data"]]
