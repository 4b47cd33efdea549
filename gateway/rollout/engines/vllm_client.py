"""An engine reached over vLLM's HTTP dialect: a real `vllm serve`, or rollout's local engine server.

Contract: maps the engine protocol onto `/v1/completions` with token-id prompts, `logprobs=0` and
`return_token_ids`, and onto the LoRA, sleep and health routes. A connection failure, a 503 or a timeout raise
`EngineUnavailable`; any other error response raises `EngineError` with the server's message.
"""

from __future__ import annotations

from typing import Any

import httpx

from rollout.engines.protocol import (
    CheckpointRef,
    EngineError,
    EngineUnavailable,
    SampleRequest,
    SampleResult,
)

__all__ = ["EngineError", "VLLMEngine"]


class VLLMEngine:
    def __init__(self, base_url: str, *, name: str = "vllm", timeout_s: float = 600) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s)

    async def close(self) -> None:
        await self._client.aclose()

    async def _post(self, path: str, payload: dict[str, Any] | None = None) -> httpx.Response:
        try:
            response = await self._client.post(path, json=payload)
        except (httpx.ConnectError, httpx.TimeoutException, httpx.RemoteProtocolError) as error:
            raise EngineUnavailable(f"engine at {self.base_url} is unreachable: {error}") from error
        self._check(response)
        return response

    def _check(self, response: httpx.Response) -> None:
        if response.status_code == 503:
            retry = float(response.headers.get("retry-after", "1"))
            raise EngineUnavailable(f"engine at {self.base_url} is unavailable: {response.text}", retry)
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            raise EngineError(f"engine at {self.base_url} answered {response.status_code}: {message}")

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
        return SampleResult(ids, logprobs, finish, body.get("model", request.model))

    async def load(self, checkpoint: CheckpointRef) -> None:
        await self._post(
            "/v1/load_lora_adapter", {"lora_name": checkpoint.name, "lora_path": checkpoint.path}
        )

    async def sleep(self) -> None:
        await self._post("/sleep?level=1")

    async def wake(self) -> None:
        await self._post("/wake_up")

    async def health(self) -> bool:
        try:
            return (await self._client.get("/health", timeout=5)).status_code == 200
        except httpx.HTTPError:
            return False

    async def models(self) -> list[str]:
        response = await self._client.get("/v1/models")
        self._check(response)
        return [entry["id"] for entry in response.json()["data"]]
