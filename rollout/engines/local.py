"""The local engine: transformers (+ peft for LoRA checkpoints) on CPU or CUDA, batching concurrent requests.

Contract:
- `LocalEngine` implements the engine protocol in process; `rollout.engines.vllm_server` puts it behind the
  subset of vLLM's HTTP dialect we use, so the same client code drives this engine and a real vLLM.
- At most `max_queued` requests wait for a batch; one more is refused with `EngineUnavailable` (a retryable
  503 behind the HTTP server), so a flood queues no unbounded work.
- Requests that arrive while a batch is being formed (within `batch_window_s`, up to `max_batch`) share
  forward passes; requests for different checkpoints (adapters) run in separate batches. A request that
  finishes leaves its batch: a `sample` gets its result then, not when the batch's longest row ends.
- The base weights are served as `served_name`; each loaded checkpoint is served under its own name: a LoRA
  adapter (a directory with `adapter_config.json`) on the base model through peft, full weights (`full` or
  `merged`: a directory with `config.json`) as a model of their own, held in memory until unloaded.
- Asleep, the engine holds no accelerator memory and refuses samples with `EngineUnavailable`. `sleep` returns
  once the batch in flight has finished (its turns complete); requests queued behind it are refused, never
  sampled while asleep.
- Callers may be on several event loops (an HTTP server's thread and the caller's own): each request is handed
  to the batcher's loop, and its result, tokens or error back to the caller's loop, thread-safely.
- Key/value states are kept across requests in a prefix cache of `prefix_cache_mb` (0: none; least recently
  used evicted first: rollout.engines.prefix_cache), keyed by the served name and the load that made it, so a
  conversation's next turn prefills only its new tokens and an unloaded (or reloaded) checkpoint's states are
  never reused. Each result's `cached_tokens` says how many prompt tokens came from it. A model whose cache
  cannot be shared by a shorter prefix (sliding-window or linear-attention layers: Qwen3.5) samples without
  it; `prefix_cache_off` says why. Asleep, the cache is emptied.
- `stream` hands out each token as its batch draws it (the batch runs on a worker thread, which passes tokens
  to the event loop); its ids and logprobs are those `sample` would return, from the same batched loop. A
  stream closed early, or a `sample` whose caller was cancelled, stops its row of the batch after the next
  token.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from rollout.config.defaults import PREFIX_CACHE_MB
from rollout.engines.prefix_cache import PrefixCache
from rollout.engines.protocol import (
    CheckpointRef,
    EngineUnavailable,
    FinishReason,
    SampleChunk,
    SampleRequest,
    SampleResult,
)
from rollout.engines.sampling import Reuse, Sampled, reuse_refused, sample_batch

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    request: SampleRequest
    loop: asyncio.AbstractEventLoop  # the caller's: its future and chunks are settled there
    future: asyncio.Future[SampleResult] | None  # a `sample`'s; None for a stream
    chunks: asyncio.Queue[SampleChunk | BaseException] | None = None  # a stream's tokens, as they are drawn
    queued_at: float = field(default_factory=time.perf_counter)
    closed: bool = False  # the stream's reader went away: stop drawing its tokens

    def wanted(self) -> bool:
        return not self.closed and not (self.future is not None and self.future.cancelled())

    def settle(self, result: SampleResult | BaseException) -> None:
        """Give a `sample` its result or error, or a stream its error (from any thread)."""

        def on_its_loop() -> None:
            if self.future is not None and not self.future.done():
                if isinstance(result, BaseException):
                    self.future.set_exception(result)
                else:
                    self.future.set_result(result)
            elif self.chunks is not None and isinstance(result, BaseException):
                self.chunks.put_nowait(result)

        self.loop.call_soon_threadsafe(on_its_loop)

    def hand(self, chunk: SampleChunk) -> None:
        """Give a stream its next token (from any thread)."""
        if self.chunks is not None:
            self.loop.call_soon_threadsafe(self.chunks.put_nowait, chunk)


class LocalEngine:
    def __init__(
        self,
        model_path: str,
        *,
        device: str | None = None,
        served_name: str = "base",
        max_batch: int = 32,
        batch_window_s: float = 0.005,
        max_queued: int = 256,
        prefix_cache_mb: int = PREFIX_CACHE_MB,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = "local"
        self.served_name = served_name
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.model: Any = model.to(self.device).eval()
        self.model_path = model_path
        self.adapters: dict[str, str] = {}  # served name -> the adapter directory it was loaded from
        self.full: dict[str, Any] = {}  # served name -> a full-weight checkpoint's own model
        # peft names adapters as module keys, which may not hold "." (checkpoint names may): map them.
        self._adapter_ids: dict[str, str] = {}
        self._loaded_count = 0
        # Loading or unloading an adapter changes the modules a batch runs through: never during a batch.
        self._model_lock = asyncio.Lock()
        self.max_batch, self.batch_window_s = max_batch, batch_window_s
        self.max_queued = max_queued
        self._queued = (
            0  # requests submitted and not yet taken into a batch (callers may be on other threads)
        )
        self._queued_lock = threading.Lock()
        self.sleeping = False
        eos = self.model.generation_config.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()  # the batcher's, on the batcher's loop
        self._batcher: asyncio.Task[None] | None = None
        self.batches_run = 0
        self.largest_batch = 0
        self.running = 0  # requests taken into the batches being sampled
        self.prefix_cache: PrefixCache | None = None
        self.prefix_cache_off: str | None = None  # why there is no prefix cache, when there is none
        if prefix_cache_mb == 0:
            self.prefix_cache_off = "services.engine.prefix_cache_mb=0"
        elif (refused := reuse_refused(self.model)) is not None:
            self.prefix_cache_off = f"{model_path}: {refused}"
        else:
            self.prefix_cache = PrefixCache(prefix_cache_mb << 20)
        self._loads = itertools.count(1)
        self._cache_keys: dict[str, str | None] = {served_name: f"{served_name}#0"}  # None: not cacheable

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet taken into a batch."""
        return self._queued

    @property
    def models(self) -> list[str]:
        return [self.served_name, *self.adapters, *self.full]

    def _admit(self, request: SampleRequest) -> None:
        if self.sleeping:
            raise EngineUnavailable("the local engine is asleep", retry_after_s=2.0)
        if request.model not in self.models:
            raise KeyError(f"model {request.model!r} is not loaded; loaded: {', '.join(self.models)}")

    def _submit(self, pending: _Pending) -> None:
        with self._queued_lock:
            if self._queued >= self.max_queued:
                raise EngineUnavailable(
                    f"the local engine has {self._queued} requests waiting, its limit: retry shortly",
                    retry_after_s=1.0,
                )
            self._queued += 1
        batcher = self._batcher
        if batcher is None or batcher.done() or batcher.get_loop().is_closed():
            with self._queued_lock:
                self._queued = 1  # what the old queue held is gone with its loop
            self._queue = asyncio.Queue()
            batcher = self._batcher = pending.loop.create_task(self._run_batches(self._queue))
        if batcher.get_loop() is pending.loop:
            self._queue.put_nowait(pending)
        else:  # called from another loop (another thread): hand it over thread-safely
            batcher.get_loop().call_soon_threadsafe(self._queue.put_nowait, pending)

    async def sample(self, request: SampleRequest) -> SampleResult:
        self._admit(request)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SampleResult] = loop.create_future()
        self._submit(_Pending(request, loop, future))
        return await future

    async def stream(self, request: SampleRequest) -> AsyncGenerator[SampleChunk]:
        self._admit(request)
        pending = _Pending(request, asyncio.get_running_loop(), None, chunks=asyncio.Queue())
        self._submit(pending)
        assert pending.chunks is not None
        try:
            while True:
                chunk = await pending.chunks.get()
                if isinstance(chunk, BaseException):
                    raise chunk
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            pending.closed = True

    async def _run_batches(self, queue: asyncio.Queue[_Pending]) -> None:
        while True:
            first = await queue.get()
            pending = [first]
            deadline = time.perf_counter() + self.batch_window_s
            while len(pending) < self.max_batch:
                timeout = deadline - time.perf_counter()
                if timeout <= 0:
                    break
                try:
                    pending.append(await asyncio.wait_for(queue.get(), timeout))
                except TimeoutError:
                    break
            with self._queued_lock:
                self._queued = max(0, self._queued - len(pending))
            by_model: dict[str, list[_Pending]] = {}
            for item in pending:
                by_model.setdefault(item.request.model, []).append(item)
            self.running = len(pending)
            try:
                for model_name, group in by_model.items():
                    await self._run_group(model_name, group)
            finally:
                self.running = 0

    def _reuse(self, model_name: str) -> Reuse | None:
        key = self._cache_keys.get(model_name)
        if self.prefix_cache is None or key is None:
            return None
        return Reuse(self.prefix_cache, key)

    async def _run_group(self, model_name: str, group: list[_Pending]) -> None:
        started = time.perf_counter()
        answered: set[int] = set()  # rows whose caller has its result (or its stream its last chunk)

        def on_token(row: int, token: int, logprob: float, finish: FinishReason | None) -> bool:
            # Runs on the sampling thread: hand the token to its caller's loop, never touch its queue from
            # here. A stream's last token goes with its finish, from on_finished.
            item = group[row]
            if item.chunks is not None and finish is None:
                item.hand(SampleChunk(ids=(token,), logprobs=(logprob,)))
            return item.wanted()

        def on_finished(row: int, sampled: Sampled) -> None:
            # Runs on the sampling thread: a caller gets its result the step its row finishes.
            if row in answered:
                return
            answered.add(row)
            item = group[row]
            timings = {"queued_s": started - item.queued_at, "compute_s": time.perf_counter() - started}
            if item.future is not None:
                item.settle(
                    SampleResult(
                        completion_ids=sampled.ids,
                        logprobs=sampled.logprobs,
                        finish_reason=sampled.finish_reason,
                        model=model_name,
                        timings=timings,
                        cached_tokens=sampled.cached_tokens,
                    )
                )
            else:
                item.hand(
                    SampleChunk(
                        ids=sampled.ids[-1:],
                        logprobs=sampled.logprobs[-1:],
                        finish_reason=sampled.finish_reason,
                        model=model_name,
                        timings=timings,
                        cached_tokens=sampled.cached_tokens,
                    )
                )

        try:
            async with self._model_lock:
                if self.sleeping:  # queued before the engine fell asleep: the caller retries after the wake
                    raise EngineUnavailable("the local engine is asleep", retry_after_s=2.0)
                model = self.full.get(model_name)
                if model is None:
                    self._activate(model_name)
                    model = self.model
                results = await asyncio.to_thread(
                    sample_batch,
                    model,
                    [p.request for p in group],
                    self.pad_id,
                    self.eos_ids,
                    on_token,
                    on_finished,
                    self._reuse(model_name),
                )
        except Exception as error:  # a failed batch fails its requests, never the batcher
            for row, item in enumerate(group):
                if row not in answered:
                    item.settle(error)
            return
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(group))
        # A row that drew nothing (no budget) never finished: answer it now; a no-op for the rows answered
        # as they finished.
        for row, result in enumerate(results):
            on_finished(row, result)

    def _activate(self, model_name: str) -> None:
        if not self.adapters:
            return
        if model_name == self.served_name:
            self.model.base_model.disable_adapter_layers()
        else:
            self.model.base_model.enable_adapter_layers()
            self.model.set_adapter(self._adapter_ids[model_name])

    async def load(self, checkpoint: CheckpointRef) -> None:
        from pathlib import Path

        directory = Path(checkpoint.path)
        async with self._model_lock:
            if (directory / "adapter_config.json").is_file():
                await asyncio.to_thread(self._load_adapter, checkpoint)
            elif (directory / "config.json").is_file():
                await asyncio.to_thread(self._load_full, checkpoint)
            else:
                raise ValueError(
                    f"{checkpoint.name}: {checkpoint.path} holds neither a LoRA adapter (adapter_config.json) "
                    "nor full weights (config.json)"
                )

    def _load_full(self, checkpoint: CheckpointRef) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if checkpoint.name in self.full:
            return
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        model: Any = AutoModelForCausalLM.from_pretrained(checkpoint.path, dtype=dtype)
        self.full[checkpoint.name] = model.to("cpu" if self.sleeping else self.device).eval()
        self._cache_keys[checkpoint.name] = self._new_cache_key(checkpoint.name, model)

    def _load_adapter(self, checkpoint: CheckpointRef) -> None:
        from peft import PeftModel

        if checkpoint.name in self.adapters:
            return
        self._loaded_count += 1
        adapter_id = f"adapter{self._loaded_count}"
        if not isinstance(self.model, PeftModel):
            self.model = PeftModel.from_pretrained(self.model, checkpoint.path, adapter_name=adapter_id)
        else:
            self.model.load_adapter(checkpoint.path, adapter_name=adapter_id)
        self.model.eval()
        self.adapters[checkpoint.name] = checkpoint.path
        self._adapter_ids[checkpoint.name] = adapter_id
        self._cache_keys[checkpoint.name] = self._new_cache_key(checkpoint.name, None)

    def _new_cache_key(self, name: str, model: Any) -> str | None:
        """The key the states `name` computes are kept under: new for each load, so a checkpoint unloaded
        and loaded again never meets its old states. None: its own model's cache cannot be shared."""
        if model is not None and reuse_refused(model) is not None:
            return None
        return f"{name}#{next(self._loads)}"

    def _forget_states(self, name: str) -> None:
        key = self._cache_keys.pop(name, None)
        if self.prefix_cache is not None and key is not None:
            self.prefix_cache.drop(key)

    async def unload(self, name: str) -> None:
        if name in self.full:
            async with self._model_lock:
                del self.full[name]
                self._forget_states(name)
            return
        if name not in self.adapters:
            raise KeyError(f"no checkpoint named {name!r}")
        async with self._model_lock:
            adapter_id = self._adapter_ids.pop(name)
            del self.adapters[name]
            self._forget_states(name)
            if self.adapters:
                self.model.delete_adapter(adapter_id)
            else:  # the last one: back to the plain model (a peft wrapper with no adapter cannot run)
                self.model = self.model.unload().eval()

    async def sleep(self) -> None:
        if self.sleeping:
            return
        self.sleeping = True  # from now on new requests are refused
        async with self._model_lock:  # the batch in flight finishes first; then the weights leave the device
            if self.prefix_cache is not None:
                self.prefix_cache.clear()
            await asyncio.to_thread(self._place, "cpu")

    async def wake(self) -> None:
        if not self.sleeping:
            return
        async with self._model_lock:
            await asyncio.to_thread(self._place, self.device)
            self.sleeping = False

    def _place(self, device: str) -> None:
        if not self.device.startswith("cuda"):
            return  # on CPU the weights stay where they are
        import torch

        for model in (self.model, *self.full.values()):
            model.to(device)
        if device == "cpu":
            # Each thread that ran a batch holds a cuBLAS workspace (32 MiB on Hopper) outside any model: seen
            # by scripts/gpu_check.py on an H200, a third of a tiny model's footprint left behind asleep.
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()

    async def health(self) -> bool:
        return True
