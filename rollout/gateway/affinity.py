"""Which engine, and which checkpoint, a conversation's next turn goes to: the ones that served its last turn,
while that engine's load allows.

Every turn re-sends its whole conversation. The engine that served the last turn holds that conversation's
key/value states (the local engine's prefix cache, vLLM's): sent there, the turn prefills only its new
tokens; sent anywhere else, all of them. States are kept per checkpoint, so the same holds for the checkpoint.

Contract:
- `Loads` counts the turns this gateway has in flight on each engine: `begin(engine)` counts one and returns
  what ends it (idempotent). Only this gateway's turns are counted: each gateway replica balances its own.
- `Affinities` remembers, per conversation, the engine and checkpoint that served its last turn (at most
  `capacity` conversations, the least recently served forgotten first). A conversation is its segment (one
  token-exact conversation) and, for a segment's first turn, its seat (whose earlier segments share its
  system prompt).
- `ordered` orders the slots admission found eligible (freshest first) and never adds one, so admission's
  guarantee (no turn begins on a checkpoint outside `max_lag`) is untouched:
  1. the conversation's last engine and checkpoint, while that engine has fewer than `slack` turns in flight
     beyond the least-loaded eligible engine; without `sticky`, only while that checkpoint is the freshest;
  2. with `sticky`, the other engines serving the conversation's last checkpoint, least loaded first (the
     turn keeps its behaviour policy, if not its cache);
  3. the rest: the freshest version first, the least loaded engine first within a version, ties taken in
     turn (`turn`), so load spreads.
  A conversation seen for the first time starts at 3. Load awareness is what keeps affinity from piling every
  conversation onto one engine: past the slack, moving (one prefill of the conversation) costs less than
  queueing behind an engine that is already that much busier.
- `rotate` is the order before affinity: the freshest version first, rotating among the engines serving it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollout.engines.protocol import Engine

if TYPE_CHECKING:
    from rollout.gateway.routing import EngineSlot

CONVERSATIONS_KEPT = 100_000  # a few MB: far more conversations than a fleet has in flight


def engine_key(engine: Engine) -> Hashable:
    """One engine, however many slots name it: its URL where it has one (an engine reached over HTTP), else
    the object."""
    return getattr(engine, "base_url", None) or id(engine)


@dataclass(frozen=True)
class Conversation:
    """What a turn continues: its segment, and the seat it is in."""

    segment: str
    seat: str


@dataclass(frozen=True)
class Served:
    """The engine and checkpoint that served a conversation's last turn."""

    engine: Hashable
    checkpoint: str


class Loads:
    def __init__(self) -> None:
        self._in_flight: dict[Hashable, int] = {}

    def of(self, engine: Engine) -> int:
        return self._in_flight.get(engine_key(engine), 0)

    def snapshot(self) -> dict[Hashable, int]:
        return {key: count for key, count in self._in_flight.items() if count}

    def begin(self, engine: Engine) -> Callable[[], None]:
        key = engine_key(engine)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self._in_flight[key] -= 1

        return end


class Affinities:
    def __init__(self, capacity: int = CONVERSATIONS_KEPT) -> None:
        self.capacity = capacity
        self._served: OrderedDict[str, Served] = OrderedDict()

    def last(self, conversation: Conversation) -> Served | None:
        for key in (f"segment/{conversation.segment}", f"seat/{conversation.seat}"):
            if (served := self._served.get(key)) is not None:
                return served
        return None

    def remember(self, conversation: Conversation, slot: EngineSlot) -> None:
        served = Served(engine_key(slot.engine), slot.checkpoint)
        for key in (f"segment/{conversation.segment}", f"seat/{conversation.seat}"):
            self._served[key] = served
            self._served.move_to_end(key)
        while len(self._served) > self.capacity:
            self._served.popitem(last=False)


def rotate(found: list[EngineSlot], turn: int) -> list[EngineSlot]:
    top = [s for s in found if s.version == found[0].version]
    start = turn % len(top)
    return top[start:] + top[:start] + found[len(top) :]


def ordered(
    found: list[EngineSlot],
    last: Served | None,
    loads: Loads,
    *,
    sticky: bool,
    slack: int,
    turn: int,
) -> list[EngineSlot]:
    """`found` (eligible, freshest first) in the order to try them; see the module's contract."""
    if not found:
        return []
    engines = {engine_key(s.engine): s.engine for s in found}
    count = len(engines)
    rank = {key: (i - turn) % count for i, key in enumerate(engines)}  # ties taken in turn

    def by_load(slot: EngineSlot) -> tuple[int, int, int]:
        key = engine_key(slot.engine)
        return -slot.version, loads.of(slot.engine), rank[key]

    rest = sorted(found, key=by_load)
    if last is None:
        return rest
    least = min(loads.of(engine) for engine in engines.values())
    freshest = found[0].version
    first = [
        s
        for s in rest
        if engine_key(s.engine) == last.engine
        and s.checkpoint == last.checkpoint
        and loads.of(s.engine) < least + slack
        and (sticky or s.version == freshest)
    ]
    same_checkpoint = (
        sorted((s for s in rest if s.checkpoint == last.checkpoint and s not in first), key=by_load)
        if sticky
        else []
    )
    return first + same_checkpoint + [s for s in rest if s not in first and s not in same_checkpoint]
