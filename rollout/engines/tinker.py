"""An engine that samples through Tinker: the SDK's `SamplingClient` on a base model or a checkpoint's sampler
path.

Contract:
- `load(CheckpointRef(name, path))` takes a Tinker sampler path (`tinker://…/sampler_weights/…`, what
  `save_weights_for_sampler` returns) and makes it servable as `name`; requests for the base weights use the
  base model. Sampling clients are made once per name and kept.
- `sample` sends the exact prompt ids as one token chunk and returns Tinker's sampled ids and per-token
  logprobs unchanged; the stop token ids, when given, replace Tinker's implicit end-of-sequence stop.
- Tinker holds no accelerator of ours, so `sleep` only stops taking requests (they raise `EngineUnavailable`)
  until `wake`. An unreachable or failing service raises `EngineUnavailable` (the SDK retries connection
  failures for minutes; rollout gives up after `connect_timeout_s` / `sample_timeout_s` so the gateway can
  answer 503 with Retry-After); a refusal (bad key, unknown model or sampler path, bad request) raises
  `EngineError` with Tinker's reason.
- The SDK blocks while it opens a session, so sampling clients are made on a worker thread, once per name.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from rollout.engines.protocol import (
    CheckpointRef,
    EngineError,
    EngineUnavailable,
    SampleRequest,
    SampleResult,
)

if TYPE_CHECKING:
    from tinker import SamplingClient, ServiceClient

    from rollout.engines.vllm_server import Tokenizer


class TinkerEngine:
    def __init__(
        self,
        base_model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        served_name: str = "base",
        tokenizer: Tokenizer | None = None,
        connect_timeout_s: float = 60.0,
        sample_timeout_s: float = 900.0,
    ) -> None:
        self.name = "tinker"
        self.base_model = base_model
        self.model_path = base_model
        self._tokenizer = tokenizer
        self.connect_timeout_s, self.sample_timeout_s = connect_timeout_s, sample_timeout_s
        self.base_url = base_url
        self.served_name = served_name
        self.sleeping = False
        self._api_key = api_key
        self._service: ServiceClient | None = None
        self._service_lock = asyncio.Lock()
        self._paths: dict[str, str | None] = {served_name: None}
        self._clients: dict[str, SamplingClient] = {}

    @property
    def tokenizer(self) -> Tokenizer:
        """The base model's tokenizer, for the text fields of vLLM's dialect (sampling never needs it)."""
        if self._tokenizer is None:
            raise RuntimeError("this TinkerEngine was made without a tokenizer")
        return self._tokenizer

    @property
    def models(self) -> list[str]:
        return list(self._paths)

    async def _service_client(self) -> ServiceClient:
        async with self._service_lock:
            if self._service is None:
                import tinker

                self._service = tinker.ServiceClient(base_url=self.base_url, api_key=self._api_key)
            return self._service

    async def _sampling_client(self, name: str) -> SamplingClient:
        if name not in self._paths:
            raise KeyError(f"model {name!r} is not loaded (loaded: {', '.join(self._paths)})")
        if name not in self._clients:
            service = await self._service_client()
            path = self._paths[name]
            base_model = None if path else self.base_model
            # The SDK opens its session on first use, blocking the calling thread: keep it off the event loop.
            made = _on_daemon_thread(
                lambda: service.create_sampling_client(model_path=path, base_model=base_model).result()
            )
            with _translated_errors(f"opening a Tinker sampler for {path or base_model}"):
                self._clients[name] = await _within(made, self.connect_timeout_s, "open a sampler")
        return self._clients[name]

    async def sample(self, request: SampleRequest) -> SampleResult:
        from tinker import types

        if self.sleeping:
            raise EngineUnavailable("the Tinker engine is asleep")
        params: dict[str, Any] = {
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "seed": request.seed,
        }
        if request.stop_token_ids:
            params["stop"] = list(request.stop_token_ids)
        client = await self._sampling_client(request.model)
        with _translated_errors("sampling on Tinker"):
            sampled = client.sample(
                types.ModelInput.from_ints(list(request.prompt_ids)), 1, types.SamplingParams(**params)
            )
            response = await _within(sampled.result_async(), self.sample_timeout_s, "return a sample")
        sequence = response.sequences[0]
        logprobs = sequence.logprobs
        if logprobs is None or len(logprobs) != len(sequence.tokens):
            raise EngineUnavailable("Tinker returned no per-token logprobs for a sample")
        finish = "length" if sequence.stop_reason == "length" else "stop"
        return SampleResult(
            completion_ids=tuple(int(t) for t in sequence.tokens),
            logprobs=tuple(float(x) for x in logprobs),
            finish_reason=finish,
            model=request.model,
        )

    async def load(self, checkpoint: CheckpointRef) -> None:
        if not checkpoint.path.startswith("tinker://"):
            raise ValueError(f"a Tinker checkpoint is a tinker:// sampler path, not {checkpoint.path!r}")
        self._paths[checkpoint.name] = checkpoint.path
        self._clients.pop(checkpoint.name, None)
        await self._sampling_client(checkpoint.name)

    async def unload(self, name: str) -> None:
        if name == self.served_name or name not in self._paths:
            raise KeyError(f"model {name!r} is not a loaded checkpoint")
        del self._paths[name]
        self._clients.pop(name, None)

    async def sleep(self) -> None:
        self.sleeping = True

    async def wake(self) -> None:
        self.sleeping = False

    async def health(self) -> bool:
        return not self.sleeping

    async def close(self) -> None:
        if self._service is not None:
            service, self._service = self._service, None
            await service.close("success")


def _on_daemon_thread[T](blocking: Callable[[], T]) -> asyncio.Future[T]:
    """`blocking()` on a daemon thread: the SDK may retry an unreachable service for minutes, and an executor
    thread stuck there would hold up the interpreter's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: T | BaseException, failed: bool) -> None:
        if future.done():
            return
        if failed:
            future.set_exception(cast(BaseException, outcome))
        else:
            future.set_result(cast(T, outcome))

    def run() -> None:
        try:
            outcome, failed = blocking(), False
        except BaseException as error:
            outcome, failed = error, True
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, outcome, failed)

    threading.Thread(target=run, name="tinker-sampler-open", daemon=True).start()
    return future


async def _within[T](work: Awaitable[T], timeout_s: float, what: str) -> T:
    try:
        return await asyncio.wait_for(work, timeout_s)
    except TimeoutError:
        raise EngineUnavailable(f"Tinker did not {what} within {timeout_s:g} s", retry_after_s=5.0) from None


@contextmanager
def _translated_errors(doing: str) -> Iterator[None]:
    """The SDK's errors as the engine protocol's: unavailable (retry later) or refused (say why)."""
    import tinker

    try:
        yield
    except tinker.APIStatusError as error:
        if error.status_code >= 500 or error.status_code == 429:
            raise EngineUnavailable(
                f"{doing}: Tinker answered {error.status_code}", retry_after_s=2.0
            ) from error
        raise EngineError(f"{doing}: Tinker refused ({error.status_code}): {error.message}") from error
    except tinker.APIConnectionError as error:
        raise EngineUnavailable(f"{doing}: Tinker is unreachable: {error}", retry_after_s=2.0) from error
    except tinker.RequestFailedError as error:
        if error.category == tinker.types.RequestErrorCategory.User:
            raise EngineError(f"{doing}: {error}") from error
        raise EngineUnavailable(f"{doing}: {error}", retry_after_s=2.0) from error
