"""The local engine: transformers (+ peft for LoRA checkpoints) on CPU or CUDA, batching concurrent requests.

Contract:
- `LocalEngine` implements the engine protocol in process; `rollout.engines.vllm_server` puts it behind the
  subset of vLLM's HTTP dialect we use, so the same client code drives this engine and a real vLLM.
- Requests that arrive while a batch is being formed (within `batch_window_s`, up to `max_batch`) share forward
  passes; requests for different checkpoints (adapters) run in separate batches.
- The base weights are served as `served_name`; each loaded LoRA checkpoint is served under its own name.
- Asleep, the engine holds no accelerator memory and refuses samples with `EngineUnavailable`.
- `stream` hands out each token as its batch draws it (the batch runs on a worker thread, which passes tokens to
  the event loop); its ids and logprobs are those `sample` would return, from the same batched loop. A stream
  closed early, or a `sample` whose caller was cancelled, stops its row of the batch after the next token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from rollout.engines.protocol import (
    CheckpointRef,
    EngineUnavailable,
    FinishReason,
    SampleChunk,
    SampleRequest,
    SampleResult,
)

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    request: SampleRequest
    future: asyncio.Future[SampleResult] | None  # a `sample`'s; None for a stream
    chunks: asyncio.Queue[SampleChunk | BaseException] | None = None  # a stream's tokens, as they are drawn
    queued_at: float = field(default_factory=time.perf_counter)
    closed: bool = False  # the stream's reader went away: stop drawing its tokens

    def wanted(self) -> bool:
        return not self.closed and not (self.future is not None and self.future.cancelled())


class LocalEngine:
    def __init__(
        self,
        model_path: str,
        *,
        device: str | None = None,
        served_name: str = "base",
        max_batch: int = 32,
        batch_window_s: float = 0.005,
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
        # peft names adapters as module keys, which may not hold "." (checkpoint names may): map them.
        self._adapter_ids: dict[str, str] = {}
        self._loaded_count = 0
        # Loading or unloading an adapter changes the modules a batch runs through: never during a batch.
        self._model_lock = asyncio.Lock()
        self.max_batch, self.batch_window_s = max_batch, batch_window_s
        self.sleeping = False
        eos = self.model.generation_config.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._batcher: asyncio.Task[None] | None = None
        self.batches_run = 0
        self.largest_batch = 0

    @property
    def models(self) -> list[str]:
        return [self.served_name, *self.adapters]

    def _admit(self, request: SampleRequest) -> None:
        if self.sleeping:
            raise EngineUnavailable("the local engine is asleep", retry_after_s=2.0)
        if request.model not in self.models:
            raise KeyError(f"model {request.model!r} is not loaded; loaded: {', '.join(self.models)}")
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())

    async def sample(self, request: SampleRequest) -> SampleResult:
        self._admit(request)
        future: asyncio.Future[SampleResult] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(request, future))
        return await future

    async def stream(self, request: SampleRequest) -> AsyncGenerator[SampleChunk]:
        self._admit(request)
        pending = _Pending(request, None, chunks=asyncio.Queue())
        await self._queue.put(pending)
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

    async def _run_batches(self) -> None:
        while True:
            first = await self._queue.get()
            pending = [first]
            deadline = time.perf_counter() + self.batch_window_s
            while len(pending) < self.max_batch:
                timeout = deadline - time.perf_counter()
                if timeout <= 0:
                    break
                try:
                    pending.append(await asyncio.wait_for(self._queue.get(), timeout))
                except TimeoutError:
                    break
            by_model: dict[str, list[_Pending]] = {}
            for item in pending:
                by_model.setdefault(item.request.model, []).append(item)
            for model_name, group in by_model.items():
                await self._run_group(model_name, group)

    async def _run_group(self, model_name: str, group: list[_Pending]) -> None:
        from rollout.engines.sampling import sample_batch

        started = time.perf_counter()
        loop = asyncio.get_running_loop()

        def on_token(row: int, token: int, logprob: float, finish: FinishReason | None) -> bool:
            # Runs on the sampling thread: hand the token to the event loop, never touch the queue from here.
            item = group[row]
            if item.chunks is not None:
                chunk = SampleChunk(
                    ids=(token,),
                    logprobs=(logprob,),
                    finish_reason=finish,
                    model=model_name if finish else None,
                    timings={"queued_s": started - item.queued_at, "compute_s": time.perf_counter() - started}
                    if finish
                    else {},
                )
                loop.call_soon_threadsafe(item.chunks.put_nowait, chunk)
            return item.wanted()

        try:
            async with self._model_lock:
                self._activate(model_name)
                results = await asyncio.to_thread(
                    sample_batch, self.model, [p.request for p in group], self.pad_id, self.eos_ids, on_token
                )
        except Exception as error:  # a failed batch fails its requests, never the batcher
            for item in group:
                if item.future is not None and not item.future.done():
                    item.future.set_exception(error)
                if item.chunks is not None:
                    item.chunks.put_nowait(error)
            return
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(group))
        finished = time.perf_counter()
        for item, result in zip(group, results, strict=True):
            if item.future is not None and not item.future.done():
                timings = {"queued_s": started - item.queued_at, "compute_s": finished - started}
                item.future.set_result(
                    SampleResult(
                        completion_ids=result.ids,
                        logprobs=result.logprobs,
                        finish_reason=result.finish_reason,
                        model=model_name,
                        timings=timings,
                    )
                )

    def _activate(self, model_name: str) -> None:
        if not self.adapters:
            return
        if model_name == self.served_name:
            self.model.base_model.disable_adapter_layers()
        else:
            self.model.base_model.enable_adapter_layers()
            self.model.set_adapter(self._adapter_ids[model_name])

    async def load(self, checkpoint: CheckpointRef) -> None:
        async with self._model_lock:
            await asyncio.to_thread(self._load_adapter, checkpoint)

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

    async def unload(self, name: str) -> None:
        if name not in self.adapters:
            raise KeyError(f"no adapter named {name!r}")
        async with self._model_lock:
            adapter_id = self._adapter_ids.pop(name)
            del self.adapters[name]
            if self.adapters:
                self.model.delete_adapter(adapter_id)
            else:  # the last one: back to the plain model (a peft wrapper with no adapter cannot run)
                self.model = self.model.unload().eval()

    async def sleep(self) -> None:
        if self.sleeping:
            return
        self.sleeping = True
        if self.device.startswith("cuda"):
            import torch

            self.model.to("cpu")
            torch.cuda.empty_cache()

    async def wake(self) -> None:
        if not self.sleeping:
            return
        if self.device.startswith("cuda"):
            self.model.to(self.device)
        self.sleeping = False

    async def health(self) -> bool:
        return True
