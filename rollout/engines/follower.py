"""The serving follower: beside each engine, it loads what the trainer publishes and says what the engine
serves.

Contract:
- It reads `ServingTarget`s (stream `serving/targets`) by cursor, skipping those of another base model than
  its engine's (`model`, when both name one) and, when it holds the engine key (`ack_key`), those not signed
  with the serving key derived from it (rollout.serving: any ledger writer can append a target), and keeps the
  engine serving, per policy, the newest `keep` checkpoints in a format the engine loads (so turns admitted
  within max_lag of the newest still find theirs), and every checkpoint requested on `serving/requests` and
  not yet released (an eval's, a self-play seat's). Released checkpoints stay loaded while the opponents (what
  it holds beyond each policy's newest) number fewer than `opponent_adapters`, the least recently requested
  evicted first. Files come from the blob store, hash-verified, into a cache directory; then `engine.load`.
- After every change it appends a `ServingAck` (stream `serving/acks`) with the engine's whole state (its
  opponents and their budget included), signed with `ack_key` when it has one; the gateway routes by the
  newest signed ack. Its first ack, as it starts, serves only the base model: a restarted engine never claims
  what it no longer holds. A checkpoint that is dropped is left out of the ack first and unloaded `grace_s`
  later, so turns already routed to it finish.
- A checkpoint that fails to load is reported (a warning, and `failed` in the ack: checkpoint, error,
  attempts, seconds to the next try) and tried again with exponential backoff (`retry_s`, doubling up to
  `retry_max_s`) for as long as it is wanted; the engine keeps serving what it served before. A later success
  clears the report.
- One-GPU mode (`gpu` set): while another holder has the ledger lease `gpu/{gpu}` (the trainer, for a step),
  the engine sleeps and its ack says so; when the lease is free it wakes. A follower starting wakes its engine
  first (it may have been left asleep by a follower that died).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from rollout.blobs import BlobStore
from rollout.engines.protocol import CheckpointRef
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.queries import live_lease_holder
from rollout.ledger.streams import SERVING_ACKS, SERVING_TARGETS, gpu_lease
from rollout.records.serving import BASE_CHECKPOINT, Served, ServingAck, ServingTarget
from rollout.serving.keys import serving_target_key
from rollout.serving.states import ServingRequests, desired, opponents_in
from rollout.training.checkpoints import download_files

log = logging.getLogger(__name__)


class FollowedEngine(Protocol):
    async def load(self, checkpoint: CheckpointRef) -> None: ...
    async def unload(self, name: str) -> None: ...
    async def sleep(self) -> None: ...
    async def wake(self) -> None: ...


@dataclass(frozen=True)
class FollowerConfig:
    engine: str  # the engine's name in acks
    url: str  # where the gateway reaches it
    base: str = BASE_CHECKPOINT
    model: str = ""  # the base model the engine serves (a spec): targets for another model are not its
    formats: tuple[str, ...] = ("lora",)
    keep: int = 2
    # Released opponents (self-play pins, evals) kept loaded, counting those still requested: a league's next
    # episode against a recent opponent finds it loaded (services.engine.opponent_adapters).
    opponent_adapters: int = 4
    poll_s: float = 0.5
    grace_s: float = 5.0
    gpu: str | None = None
    retry_s: float = 2.0  # the first retry of a failed load; each next one waits twice as long
    retry_max_s: float = 120.0
    runs: tuple[
        str, ...
    ] = ()  # serve only these runs' checkpoints (an engine pool of its own); () serves all
    # Signs each ack (rollout.serving.keys.load_engine_key): the gateway routes by signed acks only. Where it
    # is set, only targets signed with the key derived from it (rollout.serving.keys.serving_target_key) are
    # loaded.
    ack_key: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class _Failure:
    error: str
    attempts: int
    retry_at: float  # time.monotonic() of the next try


class ServingFollower:
    def __init__(
        self,
        ledger: Ledger,
        engine: FollowedEngine,
        store: BlobStore,
        config: FollowerConfig,
        cache_dir: Path,
    ) -> None:
        self.ledger, self.engine, self.store, self.config = ledger, engine, store, config
        self.cache_dir = cache_dir
        self._target_key = None if config.ack_key is None else serving_target_key(config.ack_key)
        self.incarnation = uuid.uuid4().hex[:10]
        self.targets: list[ServingTarget] = []
        self.serving: dict[str, Served] = {}  # checkpoint name -> what it is
        self.failed: dict[str, _Failure] = {}  # checkpoint name -> its failed loads, while it is wanted
        self.retiring: dict[str, float] = {}  # checkpoint name -> when to unload it
        self.opponents: frozenset[str] = frozenset()  # wanted beyond each policy's newest `keep`
        self.sleeping = False
        self._cursor = 0
        self._acks = 0
        self.requests = ServingRequests()

    async def run(self) -> None:
        # A follower that restarted does not know whether its engine sleeps: wake it (a no-op when awake); the
        # GPU lease, if held by the trainer, puts it back to sleep on the first step.
        try:
            await self.engine.wake()
        except Exception as error:  # an engine without sleep mode, or one not up yet: nothing to wake
            log.info("serving follower: could not wake the engine at start (%s)", error)
        await self.ack()
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # the ledger or the blob store hiccuped: look again on the next tick
                log.exception("serving follower step failed; retrying")
            await asyncio.sleep(self.config.poll_s)

    async def step(self) -> None:
        """One look: new targets, the GPU lease, loads and unloads due; acks whatever changed."""
        changed = await self._read_targets()
        changed = await self.requests.refresh(self.ledger) or changed
        if self.config.gpu is not None:
            await self._follow_gpu()
        if (changed or self._retry_due()) and not self.sleeping:
            await self.reconcile()
        await self._unload_retired()

    async def _read_targets(self) -> bool:
        changed = False
        while events := await self.ledger.read(SERVING_TARGETS, after=self._cursor):
            self._cursor = events[-1].seq
            for event in events:
                if event.kind != Kind.SERVING_TARGET:
                    continue
                try:
                    target = ServingTarget.from_payload(dict(event.payload))
                except ValueError as error:  # any ledger writer may append here: it costs only itself
                    log.warning("passing over serving target %s: %s", event.key, error)
                    continue
                if self._target_key is not None and not target.signed_by(self._target_key):
                    log.warning("passing over serving target %s: not signed by the trainer's key", event.key)
                    continue
                if target.model and self.config.model and target.model != self.config.model:
                    continue  # another base model's checkpoint: an engine of that model serves it
                if not self.config.runs or target.run in self.config.runs:
                    self.targets.append(target)
                    changed = True
        return changed

    async def reconcile(self) -> None:
        config = self.config
        want = desired(
            self.targets,
            config.formats,
            config.keep,
            self.requests.wanted(),
            self.requests.released(),
            config.opponent_adapters,
        )
        wanted_names = {t.checkpoint for t in want}
        self.opponents = frozenset(opponents_in(want, config.keep))
        now = time.monotonic()
        for name in [name for name in self.failed if name not in wanted_names]:
            del self.failed[name]  # no longer wanted: stop retrying it
        for target in want:  # newest first: the checkpoint turns are waiting for comes first
            failure = self.failed.get(target.checkpoint)
            if target.checkpoint in self.serving or (failure is not None and failure.retry_at > now):
                continue
            try:
                await self._load(target)
            except Exception as error:  # any failure to load keeps the previous checkpoints served
                attempts = 1 if failure is None else failure.attempts + 1
                wait_s = min(self.config.retry_max_s, self.config.retry_s * 2 ** min(attempts - 1, 16))
                self.failed[target.checkpoint] = _Failure(
                    error=f"{type(error).__name__}: {error}",
                    attempts=attempts,
                    retry_at=time.monotonic() + wait_s,
                )
                log.warning(
                    "could not load %s (attempt %d): %s; trying again in %.0f s",
                    target.checkpoint,
                    attempts,
                    error,
                    wait_s,
                )
            else:
                self.failed.pop(target.checkpoint, None)
                self.serving[target.checkpoint] = Served(target.policy, target.checkpoint, target.version)
                self.retiring.pop(target.checkpoint, None)
            await self.ack()
        dropped = [name for name in self.serving if name not in wanted_names]
        for name in dropped:
            del self.serving[name]
            self.retiring[name] = time.monotonic() + self.config.grace_s
        if dropped:
            await self.ack()

    async def _load(self, target: ServingTarget) -> None:
        if target.location is not None:  # a sampler path (Tinker): nothing to download
            await self.engine.load(CheckpointRef(target.checkpoint, target.location))
            return
        folder = self.cache_dir / hashlib.sha256(target.checkpoint.encode()).hexdigest()[:16] / target.format
        path = await asyncio.to_thread(download_files, self.store, target.files, folder)
        await self.engine.load(CheckpointRef(target.checkpoint, str(path)))

    async def _unload_retired(self) -> None:
        now = time.monotonic()
        for name, due in list(self.retiring.items()):
            if due <= now:
                del self.retiring[name]
                with contextlib.suppress(KeyError):  # already gone
                    await self.engine.unload(name)

    async def _follow_gpu(self) -> None:
        assert self.config.gpu is not None
        holder = await live_lease_holder(self.ledger, gpu_lease(self.config.gpu))
        held_by_other = holder is not None and holder != self.config.engine
        if held_by_other and not self.sleeping:
            await self.engine.sleep()
            self.sleeping = True
            await self.ack()
        elif not held_by_other and self.sleeping:
            await self.engine.wake()
            self.sleeping = False
            await self.ack()
            await self.reconcile()

    def _retry_due(self) -> bool:
        now = time.monotonic()
        return any(failure.retry_at <= now for failure in self.failed.values())

    def _failure_report(self) -> dict[str, str] | None:
        """The newest failure still being retried, as acks carry it."""
        if not self.failed:
            return None
        name, failure = max(self.failed.items(), key=lambda item: item[1].retry_at)
        return {
            "checkpoint": name,
            "error": failure.error,
            "attempts": str(failure.attempts),
            "retry_in_s": f"{max(0.0, failure.retry_at - time.monotonic()):.1f}",
        }

    def state(self) -> ServingAck:
        serving = tuple(sorted(self.serving.values(), key=lambda s: (s.policy, -s.version)))
        return ServingAck(
            engine=self.config.engine,
            url=self.config.url,
            incarnation=self.incarnation,
            n=self._acks,
            base=self.config.base,
            model=self.config.model,
            serving=serving,
            sleeping=self.sleeping,
            gpu=self.config.gpu,
            failed=self._failure_report(),
            opponents=tuple(sorted(name for name in self.serving if name in self.opponents)),
            opponent_budget=self.config.opponent_adapters,
        )

    async def ack(self) -> ServingAck:
        self._acks += 1
        ack = replace(self.state(), n=self._acks)
        if self.config.ack_key is not None:
            ack = ack.signed(self.config.ack_key)
        await self.ledger.append_one(SERVING_ACKS, NewEvent(ack.key, Kind.SERVING_ACK, ack.to_payload()))
        return ack
