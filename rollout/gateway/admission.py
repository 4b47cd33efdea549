"""Admission: which engine may serve a turn, given the run's settings in the ledger.

Contract:
- A turn for a seat on policy P may begin only on an engine serving a checkpoint of version `v >= newest(P) -
  max_lag`, where `max_lag` and `paused` are the run's current settings (the `run` projection, read as a
  checked `rollout.run.settings.RunSettings`) and `newest(P)` is P's newest checkpoint version. The base model
  is version 0 of every policy, so a policy with no checkpoint yet (or within max_lag of version 0) is served
  by the base. Settings are re-read for every turn (a mid-run change takes effect on the next turn); nothing
  here talks to Temporal.
- Among eligible engines the order follows `routing` (rollout.config.RoutingSettings): `affine` tries first
  the engine and checkpoint that served the turn's conversation last while that engine's load allows, then
  the least loaded, freshest first (rollout.gateway.affinity); `rotate`, the freshest checkpoint first,
  rotating among the engines serving it. `begin(slot)` counts a turn in flight on its engine until the
  returned callable ends it; `served(conversation, slot)` records where a conversation's turn began.
- A seat pinned to a checkpoint goes only to engines serving that checkpoint; a seat with no run is not
  limited.
- A seat whose run names its policy's base model (`RunSettings.policy_models`) goes only to engines serving
  that model (`EngineSlot.model`), its checkpoints and its base alike; a seat of a run naming none, to engines
  of the gateway's own model (when it has one).
- A run's `max_tokens` setting caps the tokens sampled per turn (read with the other settings); its
  `temperature` setting, when set (an eval's), is the temperature every turn of the run samples with. Its
  `external_models` name the policies an external model answers (never admitted to an engine).
- Which engine serves what comes from `rollout.gateway.routing` (the engines' `ServingAck`s).
- While the run is paused, or no engine qualifies or answers, the turn waits, up to `wait_s`, then
  `EngineUnavailable` (the gateway's 503 with Retry-After); once `close()` was called (the gateway is
  stopping), at once.
- A stopped run admits no turn, paused or not: `RunStopped` at once (the gateway's 410), also for a turn that
  was waiting when the run stopped, so a run stopped while paused does not hold its last episodes forever.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rollout.config import RoutingMode, RoutingSettings
from rollout.engines.protocol import EngineUnavailable
from rollout.gateway.affinity import Affinities, Conversation, Loads, ordered, rotate
from rollout.gateway.routing import EngineSlot, Routes
from rollout.gateway.seats import Seat
from rollout.ledger import Ledger
from rollout.ledger.queries import find_run, newest_checkpoint_version
from rollout.run.settings import RunSettings

__all__ = ["Admission", "Admitted", "EngineSlot", "RunSettings", "RunStopped", "eligible"]


class RunStopped(Exception):
    """The seat's run was stopped: it admits no more turns."""


@dataclass(frozen=True)
class Admitted:
    """The engines a turn may begin on, in the order to try them, and the bound they were chosen under."""

    slots: list[EngineSlot]
    newest: int
    max_lag: int
    max_tokens: int | None = None
    temperature: float | None = None


def eligible(
    slots: list[EngineSlot], seat: Seat, settings: RunSettings, newest: int, model: str | None = None
) -> list[EngineSlot]:
    """The slots a turn of `seat` may begin on, freshest first: of engines serving `model` (any, for None).
    The base model is every policy's version 0."""
    if model is not None:
        slots = [s for s in slots if s.model == model]
    if seat.checkpoint is not None:
        return [s for s in slots if s.checkpoint == seat.checkpoint]
    floor = newest - settings.max_lag
    found = [
        s
        for s in slots
        if (s.policy == seat.policy and s.version >= floor) or (s.policy is None and floor <= 0)
    ]
    return sorted(found, key=lambda s: -s.version)


def policy_model(seat: Seat, models: Mapping[str, str]) -> str | None:
    """The base model the seat's run samples its policy from (`models`: its run's
    `RunSettings.policy_models`), or None when the run names none (every policy on the stack's one model). A
    run trains its own lineage of a policy (`{run}/{policy}`): the setting names the policy's last part."""
    return models.get(seat.policy.rpartition("/")[2])


class Admission:
    def __init__(
        self,
        ledger: Ledger,
        routes: Routes | list[EngineSlot],
        *,
        wait_s: float = 30.0,
        poll_s: float = 0.2,
        routing: RoutingSettings | None = None,
    ) -> None:
        self.ledger = ledger
        self.routes = routes if isinstance(routes, Routes) else Routes(ledger, routes)
        self.wait_s, self.poll_s = wait_s, poll_s
        self.routing = routing or RoutingSettings()
        self.loads = Loads()
        self.affinities = Affinities()
        self._turn = itertools.count()
        self._closing = False

    def close(self) -> None:
        """The gateway is stopping: every turn waiting for admission, and any that asks later, gets
        `EngineUnavailable` at once (its client retries on the gateway that comes next), so no held turn holds
        the shutdown up."""
        self._closing = True

    def begin(self, slot: EngineSlot) -> Callable[[], None]:
        """Count a turn in flight on the slot's engine; the callable returned ends it."""
        return self.loads.begin(slot.engine)

    def served(self, conversation: Conversation | None, slot: EngineSlot) -> None:
        """Remember that `conversation`'s turn began on `slot` (its next turn goes there, load allowing)."""
        if conversation is not None:
            self.affinities.remember(conversation, slot)

    async def run_settings(self, run: str | None) -> RunSettings:
        if run is None:
            return RunSettings(max_lag=1 << 30)
        found = await find_run(self.ledger, run)
        return found.settings if found else RunSettings()

    async def newest_version(self, policy: str) -> int:
        return await newest_checkpoint_version(self.ledger, policy)

    async def candidates(
        self,
        seat: Seat,
        *,
        fresh: bool = False,
        deadline: float | None = None,
        conversation: Conversation | None = None,
    ) -> Admitted:
        """Eligible engines in the order to try them (`routing`: the conversation's engine first, load
        allowing, else the least loaded, freshest first; or rotating). Waits while the run is paused or
        nothing qualifies, up to the deadline."""
        deadline = time.monotonic() + self.wait_s if deadline is None else deadline
        while True:
            if self._closing:
                raise EngineUnavailable("turn not admitted: the gateway is stopping", retry_after_s=1.0)
            settings = await self.run_settings(seat.run)
            if settings.stopped:
                raise RunStopped(f"run {seat.run} was stopped: it takes no more turns")
            reason = "the run is paused"
            if not settings.paused:
                # A seat outside any run (or pinned to a checkpoint) has no staleness bound: skip the lookup.
                unbounded = seat.run is None or seat.checkpoint is not None
                newest = 0 if unbounded else await self.newest_version(seat.policy)
                model = policy_model(seat, settings.policy_models)
                if model is None and seat.checkpoint is None:
                    # A run on the stack's one model: only engines of the gateway's own model serve its
                    # base, never another policy's engine kept beside it (a pinned seat: its checkpoint's).
                    model = self.routes.model or None
                found = eligible(await self.routes.slots(fresh=fresh), seat, settings, newest, model)
                if found:
                    turn = next(self._turn)
                    if self.routing.mode == RoutingMode.rotate:
                        slots = rotate(found, turn)
                    else:
                        last = self.affinities.last(conversation) if conversation is not None else None
                        slots = ordered(
                            found,
                            last,
                            self.loads,
                            sticky=self.routing.sticky,
                            slack=self.routing.affinity_slack,
                            turn=turn,
                        )
                    return Admitted(
                        slots=slots,
                        newest=newest,
                        max_lag=settings.max_lag,
                        max_tokens=settings.max_tokens,
                        temperature=settings.temperature,
                    )
                reason = (
                    f"no engine serves a checkpoint within max_lag={settings.max_lag} of version {newest}"
                    + (f" on {model}" if model else "")
                )
            if time.monotonic() >= deadline:
                raise EngineUnavailable(
                    f"turn not admitted: {reason}", retry_after_s=max(self.poll_s * 5, 1.0)
                )
            fresh = True
            await asyncio.sleep(self.poll_s)
