"""The one protocol every inference engine speaks to the gateway.

Contract:
- `sample` takes exact prompt token ids and returns exact completion token ids with one behaviour logprob per
  completion token (the log-probability under the engine's model at temperature 1, as vLLM reports it), the
  finish reason, and the name of the checkpoint that produced them, and how many of the prompt's tokens it
  took from its prefix cache instead of computing them (`cached_tokens`: OpenAI's
  `usage.prompt_tokens_details.cached_tokens`; 0 from an engine that keeps none). The engine never
  re-tokenises.
- Sampling parameters other than the ids (temperature, top_p, stop token ids, seed) shape which tokens are
  drawn, not how their logprobs are reported.
- `stream` (optional: `StreamingEngine`) yields the same completion as `SampleChunk`s while it is sampled:
  each chunk carries the ids sampled since the last one with their logprobs; the last chunk, and only it,
  carries the finish reason and the checkpoint's name. Concatenated, the chunks are exactly what `sample`
  would have returned (same ids, same logprob semantics). Closing the iterator early (`aclose`, or cancelling
  its consumer) stops the generation. `stream_sample` streams from any engine: one that cannot stream (Tinker,
  an external model) answers with one chunk once `sample` returns. Errors before the first chunk are raised as
  `sample` raises them.
- `load` makes a checkpoint servable under its name; `sleep` frees the accelerator (requests then fail with
  `EngineUnavailable` until `wake`); `health` is cheap and never raises.
- An engine that cannot serve (down, asleep, overloaded) raises `EngineUnavailable`; the gateway turns that
  into a 503 with Retry-After; `CheckpointNotServed` is one such case (the router's view of the engine is
  older than the engine). One that refuses the request itself raises `EngineError` with the reason.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]


class EngineUnavailable(RuntimeError):
    """The engine cannot take this request now; retry later."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CheckpointNotServed(EngineUnavailable):
    """The engine does not serve the checkpoint asked for (not loaded yet, or reloaded after a restart)."""


class EngineError(RuntimeError):
    """The engine refused a request (not an availability problem): a bad request, an unknown model, a bad
    key."""


@dataclass(frozen=True)
class SampleRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    model: str = "base"
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class SampleResult:
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    model: str
    timings: dict[str, float] = field(default_factory=dict[str, float])
    cached_tokens: int = 0  # prompt tokens taken from the engine's prefix cache

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError("an engine must return one logprob per completion token")


@dataclass(frozen=True)
class SampleChunk:
    """Ids sampled since the previous chunk, one logprob each; the last chunk has `finish_reason`, `model`
    and `cached_tokens`."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason | None = None
    model: str | None = None
    timings: dict[str, float] = field(default_factory=dict[str, float])
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logprobs):
            raise ValueError("an engine must stream one logprob per completion token")


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint an engine can load: its name (what requests ask for) and where its files are."""

    name: str
    path: str


class Engine(Protocol):
    name: str

    async def sample(self, request: SampleRequest) -> SampleResult: ...
    async def load(self, checkpoint: CheckpointRef) -> None: ...
    async def sleep(self) -> None: ...
    async def wake(self) -> None: ...
    async def health(self) -> bool: ...


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An engine that can hand out a completion token by token as it samples it."""

    def stream(self, request: SampleRequest) -> AsyncGenerator[SampleChunk]: ...


async def _one_chunk(engine: Engine, request: SampleRequest) -> AsyncGenerator[SampleChunk]:
    result = await engine.sample(request)
    yield SampleChunk(
        ids=result.completion_ids,
        logprobs=result.logprobs,
        finish_reason=result.finish_reason,
        model=result.model,
        timings=result.timings,
        cached_tokens=result.cached_tokens,
    )


def stream_sample(engine: Engine, request: SampleRequest) -> AsyncGenerator[SampleChunk]:
    """The engine's own stream when it has one; otherwise its whole sample as one chunk."""
    if isinstance(engine, StreamingEngine):
        return engine.stream(request)
    return _one_chunk(engine, request)


def collected(chunks: list[SampleChunk], model: str) -> SampleResult:
    """The `SampleResult` a finished stream amounts to (a stream cut short counts as `length`)."""
    last = chunks[-1] if chunks else None
    return SampleResult(
        completion_ids=tuple(t for c in chunks for t in c.ids),
        logprobs=tuple(x for c in chunks for x in c.logprobs),
        finish_reason=(last.finish_reason if last else None) or "length",
        model=(last.model if last else None) or model,
        timings=last.timings if last else {},
        cached_tokens=last.cached_tokens if last else 0,
    )
