"""Routes: the engine slots the gateway may send a turn to, from its configured engines and the engines' acks.

Contract:
- A configured engine (`--engine-url`, or an engine object in tests) serves its base model to every policy
  until an ack says more about it; its base model is the gateway's own (`model`).
- Every slot names the base model its engine serves (`EngineSlot.model`: the ack's, else the gateway's own),
  so a turn goes only to an engine of its policy's model (rollout.gateway.admission).
- Each engine's newest believed `ServingAck` (stream `serving/acks`) is its state: one slot for its base model
  (any policy, version 0) and one per checkpoint it serves (that checkpoint's policy and version). A sleeping
  engine has no slots. Any writer of the ledger can append an ack, so with an `ack_key` only acks signed with
  it are believed, and an engine known only by its ack is reached at the ack's URL only then (and only with
  `connect`); without one, acks are believed for the configured engines alone. A forged ack never brings a
  prompt to a server of its choosing.
- Acks are read incrementally by cursor, at most every `refresh_s` unless a fresh read is asked for (the
  gateway asks when no slot qualifies or every qualifying engine failed), so routing costs one indexed read
  per interval, not one per turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from rollout.engines.protocol import Engine
from rollout.ledger import Ledger
from rollout.records.serving import BASE_CHECKPOINT, ServingAck
from rollout.serving.states import EngineStates


@dataclass
class EngineSlot:
    """An engine and one thing it serves: a checkpoint (the name requests use), its version and its policy.
    `policy=None` is the base model, which serves every policy as version 0."""

    engine: Engine
    checkpoint: str = BASE_CHECKPOINT
    version: int = 0
    policy: str | None = None
    model: str = ""  # the engine's base model (a spec); "" where nothing said (the gateway's own model)


def _engine_url(engine: Engine) -> str | None:
    return getattr(engine, "base_url", None)


class Routes:
    def __init__(
        self,
        ledger: Ledger,
        configured: list[EngineSlot],
        *,
        connect: Callable[[str, str], Engine] | None = None,
        refresh_s: float = 0.5,
        ack_key: bytes | None = None,
        model: str = "",
    ) -> None:
        self.ledger = ledger
        self.model = model  # the gateway's own model: configured engines serve it, and acks naming none
        self.configured = [slot if slot.model else replace(slot, model=model) for slot in configured]
        self.ack_key = ack_key
        self.refresh_s = refresh_s
        self._connect = connect
        self._read_at = float("-inf")
        self.states = EngineStates(accept=self._believed)
        self._engines: dict[str, Engine] = {}  # url -> engine, for engines reached through their acks

    async def refresh(self) -> None:
        await self.states.refresh(self.ledger)
        self._read_at = time.monotonic()

    async def slots(self, *, fresh: bool = False) -> list[EngineSlot]:
        if fresh or time.monotonic() - self._read_at >= self.refresh_s:
            await self.refresh()
        acks = self.states.by_url
        found = [slot for slot in self.configured if _engine_url(slot.engine) not in acks]
        for url, ack in acks.items():
            if ack.sleeping:
                continue
            engine = self._engine_for(url, ack.engine)
            if engine is None:
                continue
            model = ack.model or self.model
            found.append(EngineSlot(engine, ack.base, model=model))
            found.extend(
                EngineSlot(engine, s.checkpoint, s.version, policy=s.policy, model=model) for s in ack.serving
            )
        return found

    def _believed(self, ack: ServingAck) -> bool:
        """An ack signed with the engines' key; without a key, one about an engine this gateway was given."""
        if self.ack_key is not None:
            return ack.signed_by(self.ack_key)
        return ack.url in {_engine_url(slot.engine) for slot in self.configured}

    async def models(self) -> set[str]:
        """The base models the believed engines serve (the gateway's own among them)."""
        return {slot.model for slot in await self.slots()} | {self.model}

    def _engine_for(self, url: str, name: str) -> Engine | None:
        for slot in self.configured:
            if _engine_url(slot.engine) == url:
                return slot.engine
        if url not in self._engines:
            if self._connect is None or self.ack_key is None:
                return None
            self._engines[url] = self._connect(url, name)
        return self._engines[url]
