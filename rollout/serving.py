"""What the serving records mean: the keys that sign targets and acks and guard every engine route, and the
folds of the serving streams (`EngineStates`, `ServingRequests`, `desired`). The records themselves
(`ServingTarget`, `ServingAck`, `ServingRequest`) are rollout.records.serving, the stream names
rollout.ledger.streams; the follower beside an engine writes acks, the gateway routes by them.

Contract:
- Targets are appended on one stream, `serving/targets`, keyed `{policy}/{version}/{format}`: one target per
  (checkpoint, format), so a retried publish records once. A target names the checkpoint, its policy and
  version, the format its files are in (`lora`: a peft adapter directory; `full`: full weights; `tinker`: a
  sampler path), and the files themselves (blob keys with hashes). A target whose checkpoint name, file names
  or format could lead outside an engine's folders is refused where it is read.
- A target names the base model its files apply to (`model`): an engine serving another base model never
  loads it (a run whose policies are on several base models; "" loads on any).
- Acks are appended on one stream, `serving/acks`, keyed `{engine}/{incarnation}/{n}`. Each ack is the
  engine's whole state: the base model it serves to every policy (its name in requests, `base`, and which
  model it is, `model`), the checkpoints it serves, whether it
  sleeps, and the last load that failed (the engine keeps serving what it served before). The newest ack of an
  engine is its state; a restarted engine starts a new incarnation whose first ack serves only the base model.
- Requests (`serving/requests`, rollout.ledger.streams.SERVING_REQUESTS) ask for a checkpoint to be served
  beyond the newest ones (an eval of an older checkpoint, a self-play seat's opponent): `ServingRequested`
  keyed `{holder}/{checkpoint}/requested`, then `ServingReleased` keyed `.../released`. `ServingRequests`
  folds them into the checkpoints some holder still wants, and the released ones, most recently requested
  first; engines serve the wanted ones while their targets exist in a format they load.
- Opponents: what an engine holds beyond each policy's newest checkpoints. Every wanted checkpoint is held;
  released ones stay held while the opponents number fewer than the engine's budget, most recently requested
  first (the least recently requested is evicted first), so a league's next episode against a recent
  opponent finds it loaded. An ack lists its opponents and the budget.
- Version 0 of every policy is the base model: a policy with no checkpoint served yet is served by the base.
- `EngineStates` folds the acks stream into the newest ack per engine URL that its `accept` believes,
  reading only what it has not read; a payload that is not an ack is passed over.
- Any writer of the ledger can append a target too, so engines load only signed ones: the trainer signs each
  (`ServingTarget.signed`) with `load_serving_key` (a key derived one way from the engine key, or a
  `serving.key` a cluster mounts), and a follower that holds the engine key loads a target only when
  `signed_by` that derived key holds: a forged target names no adapter, version or files an engine takes.
- Any writer of the ledger can append an ack, so an ack names where prompts go only when it is signed: an
  engine's follower signs each ack (`ServingAck.signed`) with the key of `load_engine_key`, and the gateway
  folds in (and routes by) an ack only when `signed_by` that key holds (rollout.gateway.routing): a newer
  unsigned ack for an engine's URL never hides its signed state.
- Every engine route but `/health` needs the engine API key (`Authorization: Bearer re-…`), which
  `engine_api_key` derives one way from that same key (HMAC-SHA256 under a fixed label): whoever holds
  `engine.key` (the gateway, an engine, its follower) holds the API key with nothing more to provision, and
  the API key, which travels on every request to an engine, does not give away the key acks are signed with.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.keyfiles import secret_file
from rollout.ledger.events import Kind
from rollout.ledger.streams import SERVING_ACKS, SERVING_REQUESTS
from rollout.records.serving import ServingAck, ServingRequest, ServingTarget

if TYPE_CHECKING:
    from rollout.ledger import Ledger

ENGINE_KEY_FILE = "engine.key"
ENGINE_API_KEY_PREFIX = "re-"  # + 64 hex digits; rollout.redaction blanks it out wherever it appears
_ENGINE_API_KEY_LABEL = b"rollout engine API key, v1"


def load_engine_key(data_dir: Path) -> bytes:
    """The key engines sign their acks with and the gateway checks them by (`engine.key` in the data
    directory, made once, mode 600; a cluster mounts one Secret into each)."""
    return secret_file(data_dir / ENGINE_KEY_FILE, lambda: secrets.token_hex(32).encode()).strip()


def engine_api_key(engine_key: bytes) -> str:
    """The bearer key of every engine route (`re-` + 64 hex digits), derived one way from `engine_key`
    (`load_engine_key`): vLLM gets it as `VLLM_API_KEY`, our engine server checks it, and every client of an
    engine sends it; knowing it does not give away `engine_key`, which signs the acks."""
    return ENGINE_API_KEY_PREFIX + hmac.new(engine_key, _ENGINE_API_KEY_LABEL, hashlib.sha256).hexdigest()


def load_engine_api_key(data_dir: Path) -> str:
    """`engine_api_key` of the data directory's `engine.key` (made once, like `load_engine_key`)."""
    return engine_api_key(load_engine_key(data_dir))


def known_engine_api_key(data_dir: Path) -> str | None:
    """`load_engine_api_key` for a probe, which makes nothing: None when there is no `engine.key` (then no
    engine of this data directory has started) or it cannot be read."""
    try:
        engine_key = (data_dir / ENGINE_KEY_FILE).read_bytes().strip()
    except OSError:
        return None
    return engine_api_key(engine_key) if engine_key else None


SERVING_KEY_FILE = "serving.key"
_SERVING_KEY_LABEL = b"rollout serving targets, v1:"


def serving_target_key(engine_key: bytes) -> bytes:
    """The key serving targets are signed with, derived one way from `engine_key`: the SHA-256 of a fixed
    label and the key, in hex (a chart derives the same with Helm's `sha256sum`), so whoever publishes targets
    (the trainer) needs no key that would let it sign an engine's acks."""
    return hashlib.sha256(_SERVING_KEY_LABEL + engine_key).hexdigest().encode()


def load_serving_key(data_dir: Path) -> bytes:
    """The key a publisher signs serving targets with: `serving.key` in the data directory where a cluster
    mounts one (the trainer's pod holds no engine key), else `serving_target_key` of `engine.key`."""
    try:
        mounted = (data_dir / SERVING_KEY_FILE).read_bytes().strip()
    except FileNotFoundError:
        mounted = b""
    return mounted or serving_target_key(load_engine_key(data_dir))


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
