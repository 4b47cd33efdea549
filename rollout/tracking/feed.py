"""The feed: a run's entries pushed to each of its backends, each entry once, in order, whatever fails.

Contract:
- `Feed.push(entries)` brings every backend up to `entries` (rollout.tracking.entries: the ledger's order).
  A backend is opened once, asked what it holds (`positions`) after opening, when a new stream appears and
  after any failure (a failed log may have landed), and given each entry above its stream's position, in
  order (up to the sink's `batch` a call): so each (stream, step) is logged once however often the feed is
  killed, restarted or retried. While one sink object lives, what it logged counts as held even before the
  backend shows it.
- A backend that fails (refuses, raises, or takes longer than `call_timeout_s` for one call) is left as it
  stands: the others go on, and it is tried again after a back-off that doubles from `BACKOFF_S` to at most
  `MAX_BACKOFF_S`. One that timed out is dropped and opened afresh (its call may still be running). Nothing
  here raises for a backend's trouble: training never waits on it.
- A trace backend (`otlp`) is given the trace streams (`traces/…`) and nothing else; the others every stream
  but those. `held(backend)` is what the feed knows a backend holds (what a trace reader reads on from).
- `Feed.of(given, directory)` is the feed to the backends a run's `TrackingInput` names, their files under
  `directory`.
- `state()` is each backend's `BackendState` (ok, logged, its last error in one line, seconds to the next
  try), what the feed's heartbeat carries to `rollout status` and the live line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.tracking.entries import Entry, is_trace
from rollout.tracking.mlflow_sink import MlflowSink
from rollout.tracking.otlp_sink import OtlpSink
from rollout.tracking.sinks import Sink
from rollout.tracking.wandb_sink import WandbSink
from rollout.workflows.tracking_types import BackendState, TrackingInput, TrackingState

BACKOFF_S = 5.0
MAX_BACKOFF_S = 120.0
CALL_TIMEOUT_S = 90.0  # W&B's init waits up to 60 s for its service
TRACE_BACKENDS = frozenset({"otlp"})  # the backends that take the trace streams (`traces/…`), and only them


@dataclass
class _Backend:
    make: Callable[[], Sink]
    backend: str
    setting: str
    traces: bool  # it takes the trace streams, and only them
    sink: Sink | None = None
    positions: dict[str, int] | None = None
    logged: int = 0
    failures: int = 0
    error: str | None = None
    retry_at: float = 0.0
    tried: bool = False
    seen: set[str] = field(default_factory=set[str])


class Feed:
    def __init__(
        self,
        run: str,
        sinks: Sequence[tuple[str, str, Callable[[], Sink]]],
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`sinks`: (backend, setting, a factory of its `Sink`) for each backend."""
        self.run = run
        self.call_timeout_s = call_timeout_s
        self.clock = clock
        self.backends = [
            _Backend(make, backend, setting, backend in TRACE_BACKENDS) for backend, setting, make in sinks
        ]

    @staticmethod
    def of(given: TrackingInput, directory: Path) -> Feed:
        """The feed to the backends `given` names, their files under `directory` (W&B's under `wandb-files/`,
        MLflow's local store under `mlflow/`, the OTLP exporter's positions under `otlp/`)."""
        sinks: list[tuple[str, str, Callable[[], Sink]]] = []
        if (wandb := given.wandb) is not None:
            sinks.append(
                (
                    "wandb",
                    WandbSink.setting,
                    lambda: WandbSink(given.run, wandb, directory / "wandb-files", given.config),
                )
            )
        if (mlflow := given.mlflow) is not None:
            sinks.append(
                (
                    "mlflow",
                    MlflowSink.setting,
                    lambda: MlflowSink(given.run, mlflow, directory / "mlflow", given.config),
                )
            )
        if (otlp := given.otlp) is not None:
            sinks.append(("otlp", OtlpSink.setting, lambda: OtlpSink(given.run, otlp, directory / "otlp")))
        return Feed(given.run, sinks)

    async def push(self, entries: Sequence[Entry]) -> None:
        for backend in self.backends:
            if self.clock() >= backend.retry_at:
                await self._push_one(backend, [e for e in entries if is_trace(e) == backend.traces])

    def behind(self, entries: Sequence[Entry]) -> bool:
        """Whether some backend does not yet hold every entry it takes."""
        return any(
            backend.positions is None
            or any(
                entry.step > backend.positions.get(entry.stream, -1)
                for entry in entries
                if is_trace(entry) == backend.traces
            )
            for backend in self.backends
        )

    def held(self, backend: str) -> dict[str, int] | None:
        """What `backend` holds of each stream, as far as this feed knows (None: not asked yet)."""
        found = next((b for b in self.backends if b.backend == backend), None)
        return None if found is None or found.positions is None else dict(found.positions)

    async def close(self, *, final: bool = True) -> None:
        """Let go of each backend's run; `final`: the rollout run is over (`Sink.close`)."""
        for backend in self.backends:
            if backend.sink is not None:
                try:
                    await self._call(backend.sink.close, final)
                except Exception as error:  # the run is over; its backend's trouble is only reported
                    backend.error = _one_line(error)
                backend.sink = None

    def state(self) -> TrackingState:
        now = self.clock()
        return TrackingState(
            run=self.run,
            backends=[
                BackendState(
                    backend=b.backend,
                    setting=b.setting,
                    ok=b.error is None,
                    logged=b.logged,
                    error=b.error,
                    retry_in_s=round(max(0.0, b.retry_at - now), 1) if b.error is not None else None,
                    tried=b.tried,
                )
                for b in self.backends
            ],
        )

    async def _push_one(self, backend: _Backend, entries: Sequence[Entry]) -> None:
        try:
            if backend.sink is None:
                sink = backend.make()
                await self._call(sink.open)
                backend.sink, backend.positions, backend.seen = sink, None, set()
            sink = backend.sink
            streams = {entry.stream for entry in entries}
            if backend.positions is None or not streams <= backend.seen:
                held = await self._call(sink.positions, streams)
                # What this sink object logged counts too: a backend may not show it yet (W&B writes its
                # files behind the calls).
                known = backend.positions or {}
                backend.positions = {s: max(held.get(s, -1), known.get(s, -1)) for s in {*held, *known}}
                backend.seen = streams
            positions = backend.positions
            pending: list[Entry] = []
            reached = dict(positions)
            for entry in entries:
                if entry.step > reached.get(entry.stream, -1):  # else the backend holds it already
                    pending.append(entry)
                    reached[entry.stream] = entry.step
            for start in range(0, len(pending), max(1, sink.batch)):
                chunk = pending[start : start + max(1, sink.batch)]
                await self._call(sink.log, chunk)
                for entry in chunk:
                    positions[entry.stream] = entry.step
                backend.logged += len(chunk)
            backend.failures, backend.error, backend.tried = 0, None, True
        except Exception as error:  # any refusal: reported, retried later, never raised into training
            backend.failures += 1
            backend.tried = True
            backend.error = _one_line(error)
            backend.retry_at = self.clock() + min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (backend.failures - 1))
            backend.seen = set()  # read back again (and keep what was logged): a failed log may have landed
            if isinstance(error, TimeoutError):
                backend.sink, backend.positions = None, None  # its call may still be running: start afresh

    async def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wait_for(asyncio.to_thread(method, *args), self.call_timeout_s)


def _one_line(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "did not answer in time"
    text = " ".join(str(error).split()) or type(error).__name__
    if len(text) > 300:  # a library's chained message: the request it made, then the cause at its end
        text = f"{text[:120]} … {text[-180:]}"
    return f"{type(error).__name__}: {text}"
