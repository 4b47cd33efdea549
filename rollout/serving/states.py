"""The folds of the serving streams (rollout.serving says what the streams hold): each engine's believed
state, the checkpoints holders still want, and what an engine should serve.

Contract:
- `EngineStates` folds the acks stream into the newest ack per engine URL that its `accept` believes,
  reading only what it has not read; a payload that is not an ack is passed over.
- `desired(...)` is what an engine should serve, newest first: per policy its newest `keep` versions in a
  format it loads, every requested checkpoint, and released ones within the opponents' budget;
  `opponents_in` names what an engine serves beyond each policy's newest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rollout.ledger.events import Kind
from rollout.ledger.streams import SERVING_ACKS, SERVING_REQUESTS
from rollout.records.serving import ServingAck, ServingRequest, ServingTarget

if TYPE_CHECKING:
    from rollout.ledger import Ledger


@dataclass
class EngineStates:
    """Each engine's state: its newest ack that `accept` believes, by engine URL (a later ack replaces an
    earlier one). An ack it does not believe (unsigned, where acks are signed), or a payload that is not an
    ack, is passed over: it never shadows the engine's believed state."""

    by_url: dict[str, ServingAck] = field(default_factory=dict[str, ServingAck])
    cursor: int = 0  # the last `serving/acks` sequence number folded in
    accept: Callable[[ServingAck], bool] = lambda ack: True

    async def refresh(self, ledger: Ledger) -> None:
        """Fold in the acks appended since the last refresh."""
        while events := await ledger.read(SERVING_ACKS, after=self.cursor):
            self.cursor = events[-1].seq
            for event in events:
                try:
                    ack = ServingAck.from_payload(dict(event.payload))
                except (TypeError, ValueError):
                    continue  # any ledger writer may append here: a forged payload costs only itself
                if self.accept(ack):
                    self.by_url[ack.url] = ack

    def values(self) -> list[ServingAck]:
        return list(self.by_url.values())


@dataclass
class ServingRequests:
    """The checkpoints some holder has requested and not released, and those every holder released, folded
    from `serving/requests` by cursor."""

    holders: dict[str, set[str]] = field(default_factory=dict[str, set[str]])  # checkpoint -> holders
    last_requested: dict[str, int] = field(default_factory=dict[str, int])  # checkpoint -> seq of its request
    cursor: int = 0

    async def refresh(self, ledger: Ledger) -> bool:
        """Fold in what was appended since the last refresh; True when the wanted set changed."""
        before = self.wanted()
        while events := await ledger.read(SERVING_REQUESTS, after=self.cursor):
            self.cursor = events[-1].seq
            for event in events:
                try:
                    request = ServingRequest.from_payload(event.payload)
                except ValueError:
                    continue  # not a request any writer of ours made: it asks for nothing
                holder, checkpoint = request.holder, request.checkpoint
                if event.kind == Kind.SERVING_REQUESTED:
                    self.holders.setdefault(checkpoint, set()).add(holder)
                    self.last_requested[checkpoint] = event.seq
                elif event.kind == Kind.SERVING_RELEASED:
                    self.holders.get(checkpoint, set()).discard(holder)
        return self.wanted() != before

    def wanted(self) -> frozenset[str]:
        return frozenset(checkpoint for checkpoint, holders in self.holders.items() if holders)

    def released(self) -> tuple[str, ...]:
        """The checkpoints no holder wants any more, the most recently requested first."""
        wanted = self.wanted()
        gone = [checkpoint for checkpoint in self.last_requested if checkpoint not in wanted]
        return tuple(sorted(gone, key=lambda checkpoint: -self.last_requested[checkpoint]))


def desired(
    targets: list[ServingTarget],
    formats: tuple[str, ...],
    keep: int,
    requested: frozenset[str] = frozenset(),
    released: tuple[str, ...] = (),
    opponent_budget: int = 0,
) -> list[ServingTarget]:
    """What an engine should serve (newest first): per policy, the newest `keep` versions it has a format for;
    every `requested` checkpoint it has a format for; and of the `released` ones (most recently requested
    first), as many as keep the checkpoints beyond the newest within `opponent_budget`."""
    by_policy: dict[str, dict[int, ServingTarget]] = {}
    for target in targets:
        if target.format not in formats:
            continue
        versions = by_policy.setdefault(target.policy, {})
        held = versions.get(target.version)
        # One checkpoint may be targeted in several formats: prefer the engine's earlier-listed format.
        if held is None or formats.index(target.format) < formats.index(held.format):
            versions[target.version] = target
    chosen: list[ServingTarget] = []
    older: dict[str, ServingTarget] = {}  # checkpoint -> target, beyond its policy's newest `keep`
    for versions in by_policy.values():
        newest = sorted(versions, reverse=True)
        chosen.extend(versions[v] for v in newest[:keep])
        older.update((versions[v].checkpoint, versions[v]) for v in newest[keep:])
    opponents = [older[checkpoint] for checkpoint in sorted(requested) if checkpoint in older]
    for checkpoint in released:
        if len(opponents) >= opponent_budget:
            break
        if checkpoint in older:
            opponents.append(older[checkpoint])
    return sorted([*chosen, *opponents], key=lambda t: -t.version)


def opponents_in(serving: list[ServingTarget], keep: int) -> tuple[str, ...]:
    """The checkpoints of `serving` beyond each policy's newest `keep` (its opponents), by name."""
    by_policy: dict[str, list[ServingTarget]] = {}
    for target in serving:
        by_policy.setdefault(target.policy, []).append(target)
    older = (t for held in by_policy.values() for t in sorted(held, key=lambda t: -t.version)[keep:])
    return tuple(sorted(t.checkpoint for t in older))
