"""Which model's renderer (tokenizer and chat template) a seat's turns use: the gateway's own model's, or that
of the base model the seat's policy is on when its run's policies are on several
(`RunSettings.policy_models`).

Contract:
- `Renderers.for_seat(seat)` is the renderer a seat's turns are rendered, tokenised, cut at stop strings and
  parsed with: that of the base model its run names for its policy; for a seat pinned to a checkpoint whose
  run names none (an eval of that checkpoint), that of the engine serving the checkpoint; else the gateway's
  own. A run's policy models are fixed when it is made: read once per run and kept (the newest
  `MAX_RUNS_REMEMBERED` runs).
- A model's renderer is built once, its tokenizer loaded off the event loop, and only for a model that a
  believed engine serves (rollout.gateway.routing): a model name a ledger writer recorded never makes the
  gateway load a path, or download anything, of its choosing. A seat whose model no engine serves gets
  `EngineUnavailable` (the gateway's 503, which clients retry), as when no engine serves its checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rollout.engines.protocol import EngineUnavailable
from rollout.gateway.admission import Admission, policy_model
from rollout.gateway.seats import Seat
from rollout.rendering import ModelRenderer

MAX_RUNS_REMEMBERED = 1024
NOT_SERVED_RETRY_S = 5.0


class Renderers:
    def __init__(
        self,
        admission: Admission,
        own: ModelRenderer,
        *,
        model: str = "",
        build: Callable[[str], ModelRenderer] | None = None,
    ) -> None:
        self.admission = admission
        self.own, self.model = own, model
        self._build = build  # a model spec -> its renderer (loads its tokenizer); None: the own model only
        self._built: dict[str, ModelRenderer] = {}
        self._by_run: dict[str, dict[str, str]] = {}  # run -> its policy models
        self._lock = asyncio.Lock()

    async def for_seat(self, seat: Seat) -> ModelRenderer:
        if seat.run is None:
            return self.own
        models = self._by_run.get(seat.run)
        if models is None:
            models = (await self.admission.run_settings(seat.run)).policy_models
            if len(self._by_run) >= MAX_RUNS_REMEMBERED:
                self._by_run.pop(next(iter(self._by_run)))
            self._by_run[seat.run] = models
        model = policy_model(seat, models)
        if model is None and seat.checkpoint is not None:
            served = [s.model for s in await self.admission.routes.slots() if s.checkpoint == seat.checkpoint]
            model = served[0] if served else None
        return await self.for_model(model)

    async def for_model(self, model: str | None) -> ModelRenderer:
        if not model or model == self.model:
            return self.own
        if (built := self._built.get(model)) is not None:
            return built
        if self._build is None or model not in await self.admission.routes.models():
            raise EngineUnavailable(
                f"no engine serves {model}, the base model of this seat's policy",
                retry_after_s=NOT_SERVED_RETRY_S,
            )
        async with self._lock:
            if model not in self._built:
                self._built[model] = await asyncio.to_thread(self._build, model)
        return self._built[model]
