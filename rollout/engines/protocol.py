"""The one protocol every inference engine speaks to the gateway.

Contract:
- `sample` takes exact prompt token ids and returns exact completion token ids with one behaviour logprob per
  completion token (the log-probability under the engine's model at temperature 1, as vLLM reports it), the
  finish reason, and the name of the checkpoint that produced them. The engine never re-tokenises.
- Sampling parameters other than the ids (temperature, top_p, stop token ids, seed) shape which tokens are drawn,
  not how their logprobs are reported.
- `load` makes a checkpoint servable under its name; `sleep` frees the accelerator (requests then fail with
  `EngineUnavailable` until `wake`); `health` is cheap and never raises.
- An engine that cannot serve (down, asleep, overloaded) raises `EngineUnavailable`; the gateway turns that into
  a 503 with Retry-After; `CheckpointNotServed` is one such case (the router's view of the engine is older than
  the engine). One that refuses the request itself raises `EngineError` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

FinishReason = Literal["stop", "length"]


class EngineUnavailable(RuntimeError):
    """The engine cannot take this request now; retry later."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CheckpointNotServed(EngineUnavailable):
    """The engine does not serve the checkpoint asked for (not loaded yet, or reloaded after a restart)."""


class EngineError(RuntimeError):
    """The engine refused a request (not an availability problem): a bad request, an unknown model, a bad key."""


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

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError("an engine must return one logprob per completion token")


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
