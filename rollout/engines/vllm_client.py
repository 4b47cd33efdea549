"""An engine reached over vLLM's HTTP dialect: a real `vllm serve`, or rollout's local engine server.

Contract: maps the engine protocol onto `/v1/completions` with token-id prompts, `logprobs=0` and
`return_token_ids`, and onto the LoRA, sleep and health routes. A connection failure, a 503, a server fault
(500, 502, 504: a dead engine core, a proxy without its engine), a timeout, a completion for a model the
engine does not serve (404) or one vLLM aborted (`finish_reason: "abort"`, as it ends requests in flight when
put to sleep) raise `EngineUnavailable`; any other error response, or a finish reason other than `stop`,
`length` and `abort`, raises `EngineError` with the server's message: a completion is never passed on as
finished unless the model finished it; a 500 from an engine whose /health still answers is that request's
failure (`EngineError`), not a dead engine. Unloading an adapter the engine does not hold (vLLM's 404) raises
`KeyError`; loading one that trains modules outside `rollout.config.defaults.LORA_TARGET_MODULES` (vLLM's
`--lora-target-modules`) raises `EngineError`. `sleep` pauses the engine (what is being generated finishes,
new requests are refused with 503 until `wake`), then sleeps, aborting what the pause left queued. `stream`
asks for the same completion with `stream: true` and yields each server-sent chunk's `token_ids` and logprobs
as they arrive (ids from `token_ids`, or from `token_id:N` tokens when the server was started with
`--return-tokens-as-token-ids` and sends no `token_ids`); errors before the first chunk are raised as `sample`
raises them, an error event as `EngineError` (or `EngineUnavailable` when it is vLLM's retryable 503, as for a
request refused while paused) and an abort mid-stream as `EngineUnavailable` (the gateway then records the
turn aborted). Closing the stream early closes its connection, which is how vLLM learns to stop generating.
A result's `cached_tokens` is the answer's `usage.prompt_tokens_details.cached_tokens` (a stream asks for its
usage chunk), 0 where the engine reports none, never more than the prompt.

Every request carries `api_key` as `Authorization: Bearer <key>` (the engine API key,
rollout.serving.keys.engine_api_key, which vLLM and rollout's engine server both demand); `api_key=None` sends
none, for an engine that asks none (a stand-in in a test). A refusal for want of the key (401) raises
`EngineError`, saying so. The key is never part of a message or the client's `repr`.

The engine hop is on every turn's path, so it uses aiohttp's client (keep-alive, one session per event loop):
it costs a fraction of httpx's per-request CPU, which on a small machine is most of the gateway's added
latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from rollout.config.defaults import LORA_TARGET_MODULES
from rollout.engines.protocol import (
    CheckpointNotServed,
    CheckpointRef,
    EngineError,
    EngineUnavailable,
    FinishReason,
    SampleChunk,
    SampleRequest,
    SampleResult,
)

__all__ = ["EngineError", "VLLMEngine"]

SERVER_FAULTS = frozenset({500, 502, 504})


class _Answer:
    def __init__(self, status: int, headers: Any, text: str) -> None:
        self.status, self.headers, self.text = status, headers, text

    def json(self) -> Any:
        return json.loads(self.text)


class VLLMEngine:
    def __init__(
        self, base_url: str, *, api_key: str | None, name: str = "vllm", timeout_s: float = 600
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                self.base_url,
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=0),
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
        await self._check(answer, path=path)
        return answer

    async def _check(self, answer: _Answer, *, path: str = "") -> None:
        if answer.status == 500 and await self.health():
            # vLLM answers 500 for a dead engine core (its /health then fails too) and for any failure it does
            # not classify (an adapter it cannot load, say): with the engine alive, this request failed and
            # would again.
            raise EngineError(f"engine at {self.base_url} failed the request (500): {answer.text[:500]}")
        self._raise_for(answer, path=path)

    def _raise_for(self, answer: _Answer, *, path: str = "") -> None:
        if answer.status == 404 and path == "/v1/completions":
            raise CheckpointNotServed(f"engine at {self.base_url} does not serve that model: {answer.text}")
        if answer.status == 503:
            retry = float(answer.headers.get("retry-after", "1"))
            raise EngineUnavailable(f"engine at {self.base_url} is unavailable: {answer.text}", retry)
        if answer.status in SERVER_FAULTS:
            # vLLM answers 500 once its engine core has died (and until it is restarted: `_check` has seen its
            # /health fail); a proxy in front of it 502 or 504: the engine is not there now, no fault of the
            # request.
            raise EngineUnavailable(
                f"engine at {self.base_url} failed ({answer.status}): {answer.text[:500]}"
            )
        if answer.status == 401:
            raise EngineError(
                f"engine at {self.base_url} refused the request for want of its API key (401): the client needs "
                "the engine API key of the engine's DATA_DIR/engine.key (`rollout engine api-key`)"
            )
        if answer.status >= 400:
            try:
                message = answer.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = answer.text
            raise EngineError(f"engine at {self.base_url} answered {answer.status}: {message}")

    def _payload(self, request: SampleRequest) -> dict[str, Any]:
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
        return payload

    async def sample(self, request: SampleRequest) -> SampleResult:
        body = (await self._post("/v1/completions", self._payload(request))).json()
        choice = body["choices"][0]
        return SampleResult(
            completion_ids=_token_ids(choice),
            logprobs=tuple(float(x) for x in choice["logprobs"]["token_logprobs"]),
            finish_reason=_finish(choice, self.base_url),
            model=body.get("model", request.model),
            cached_tokens=_cached_tokens(body.get("usage"), request),
        )

    async def stream(self, request: SampleRequest) -> AsyncGenerator[SampleChunk]:
        payload = {**self._payload(request), "stream": True, "stream_options": {"include_usage": True}}
        try:
            async with self._client().post("/v1/completions", json=payload) as response:
                if response.status != 200:
                    answer = _Answer(response.status, response.headers, await response.text())
                    await self._check(answer, path="/v1/completions")
                    raise EngineError(f"engine at {self.base_url} answered {answer.status}: {answer.text}")
                last: SampleChunk | None = None
                async for line in response.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise _stream_error(event["error"], self.base_url)
                    if last is not None and event.get("usage"):  # after the last choice, before [DONE]
                        last = replace(last, cached_tokens=_cached_tokens(event["usage"], request))
                    for choice in event.get("choices") or []:  # the usage chunk has none
                        ids = _token_ids(choice)
                        logprobs = tuple(
                            float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []
                        )
                        if choice.get("finish_reason") is not None:
                            # Held until [DONE] (right behind it) so the connection is read to its end and
                            # reused.
                            last = SampleChunk(
                                ids=ids,
                                logprobs=logprobs,
                                finish_reason=_finish(choice, self.base_url),
                                model=event.get("model", request.model),
                            )
                        elif ids:
                            yield SampleChunk(ids=ids, logprobs=logprobs)
                if last is None:
                    raise EngineError(f"engine at {self.base_url} ended the stream without a finish reason")
                yield last
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as error:
            raise EngineUnavailable(f"engine at {self.base_url} is unreachable: {error!r}") from error

    async def load(self, checkpoint: CheckpointRef) -> None:
        _check_targets(checkpoint)
        try:
            await self._post(
                "/v1/load_lora_adapter", {"lora_name": checkpoint.name, "lora_path": checkpoint.path}
            )
        except EngineError as error:
            # vLLM refuses a name it already holds (a follower restarted beside it): that one is loaded.
            if "already been loaded" not in str(error):
                raise

    async def unload(self, name: str) -> None:
        """Unload the adapter `name`; one the engine does not hold raises `KeyError` (vLLM answers 404)."""
        answer = await self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if answer.status == 404:
            raise KeyError(f"engine at {self.base_url} holds no adapter {name!r}")
        await self._check(answer)

    async def sleep(self) -> None:
        """Level 1 (weights to CPU memory, KV cache dropped) once the requests being generated have finished.

        `/sleep` alone would not do: its default mode, `abort`, cuts what is in flight short, and in any mode
        vLLM queues a request that arrives while it sleeps until it wakes (a turn would hang for a whole
        training step). So it is paused first (`/pause?mode=wait`: the requests being generated finish,
        anything new is refused with a retryable 503, which the gateway waits out as it does the local
        engine's), then put to sleep with `mode=abort`: what the pause left queued (behind `--max-num-seqs`,
        or preempted) ends with `abort`, so the gateway samples it again after the wake (or records it aborted
        if it had begun streaming) instead of it waiting out the step. A sleep that fails after its pause
        resumes the engine, so it is never left refusing every turn."""
        await self._post("/pause?mode=wait")
        try:
            await self._post("/sleep?level=1&mode=abort")
        except BaseException:
            with contextlib.suppress(EngineError, EngineUnavailable):
                await self._post("/resume")
            raise

    async def wake(self) -> None:
        """Wake, then resume: vLLM resumes a fully awake engine itself; `/resume` also ends the pause of a
        `sleep` whose `/sleep` failed after its `/pause` (a no-op otherwise)."""
        await self._post("/wake_up")
        await self._post("/resume")

    async def health(self) -> bool:
        try:
            return (await self._request("GET", "/health", timeout_s=5)).status == 200
        except EngineUnavailable:
            return False

    async def models(self) -> list[str]:
        answer = await self._request("GET", "/v1/models")
        await self._check(answer)
        return [entry["id"] for entry in answer.json()["data"]]


def _check_targets(checkpoint: CheckpointRef) -> None:
    """Refuse an adapter that trains modules vLLM holds no LoRA slots for (`--lora-target-modules`): vLLM
    would load it and then silently apply only part of it."""
    config = Path(checkpoint.path) / "adapter_config.json"
    if not config.is_file():
        return  # not on this host: vLLM reads it (and says what is wrong with it)
    targets = json.loads(config.read_text()).get("target_modules")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    extra = sorted(set(names) - set(LORA_TARGET_MODULES))
    if extra:
        raise EngineError(
            f"{checkpoint.name}: its adapter trains {', '.join(extra)}, which vLLM holds no LoRA slots for "
            f"(--lora-target-modules {' '.join(LORA_TARGET_MODULES)}); it would serve only part of it"
        )


def _token_ids(choice: dict[str, Any]) -> tuple[int, ...]:
    if choice.get("token_ids") is not None:
        return tuple(int(t) for t in choice["token_ids"])
    # `--return-tokens-as-token-ids` writes each sampled token as "token_id:N".
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    return tuple(int(str(t).removeprefix("token_id:")) for t in tokens)


def _stream_error(error: Any, base_url: str) -> EngineError | EngineUnavailable:
    """An error event in a stream: vLLM reports a request refused while it is paused (and any retryable
    failure) this way, as a 503 event before the first token; that one is `EngineUnavailable`, so a turn not
    yet streaming is sampled again. Any other is the engine's failure."""
    details = error if isinstance(error, dict) else {"message": error}
    message = details.get("message", error)
    if details.get("code") == 503 or details.get("type") == "ServiceUnavailableError":
        return EngineUnavailable(f"engine at {base_url} refused the request: {message}")
    return EngineError(f"engine at {base_url} failed mid-stream: {message}")


def _cached_tokens(usage: Any, request: SampleRequest) -> int:
    """The prompt tokens the engine says came from its prefix cache (`usage.prompt_tokens_details
    .cached_tokens`; vLLM sends it with `--enable-prompt-tokens-details`), 0 when it says nothing, never
    more than the prompt."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cached, int) or isinstance(cached, bool):
        return 0
    return max(0, min(cached, len(request.prompt_ids)))


def _finish(choice: dict[str, Any], base_url: str) -> FinishReason:
    """The completion's finish reason, when it is one a turn may be trained on: `stop` or `length`.

    vLLM ends what is in flight with `abort` when it is put to sleep (its default mode) or shuts down: what
    came back is partial and was not finished by the model, so it is raised as `EngineUnavailable` (a turn not
    yet streamed is sampled again; one already streaming is recorded aborted, never trained). Any other reason
    (`error`, or one this client does not know) is the engine's failure, `EngineError`: never recorded as
    done."""
    reason = choice.get("finish_reason")
    if reason == "stop" or reason == "length":
        return reason
    if reason == "abort":
        raise EngineUnavailable(
            f"engine at {base_url} aborted the request before it finished (vLLM aborts what is in flight when it "
            "is put to sleep or stops)"
        )
    raise EngineError(f"engine at {base_url} ended the completion with finish_reason {reason!r}")
