"""The serving follower: beside each engine, it loads what the trainer publishes and says what the engine serves.

Contract:
- It reads `ServingTarget`s (stream `serving/targets`) by cursor and keeps the engine serving, per policy, the
  newest `keep` checkpoints in a format the engine loads (so turns admitted within max_lag of the newest still
  find theirs), and every checkpoint requested on `serving/requests` and not yet released (an eval's). Files come from the blob store, hash-verified, into a cache directory; then `engine.load`.
- After every change it appends a `ServingAck` (stream `serving/acks`) with the engine's whole state; the
  gateway routes by the newest ack. Its first ack, as it starts, serves only the base model: a restarted engine
  never claims what it no longer holds. A checkpoint that is dropped is left out of the ack first and unloaded
  `grace_s` later, so turns already routed to it finish.
- A checkpoint that fails to load is recorded in the ack (`failed`) and not tried again; the engine keeps serving
  what it served before.
- One-GPU mode (`gpu` set): while another holder has the ledger lease `gpu/{gpu}` (the trainer, for a step), the
  engine sleeps and its ack says so; when the lease is free it wakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from rollout.blobs import BlobStore
from rollout.engines.protocol import CheckpointRef
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.queries import live_lease_holder
from rollout.ledger.streams import SERVING_ACKS, SERVING_TARGETS, gpu_lease
from rollout.serving import BASE_CHECKPOINT, Served, ServingAck, ServingRequests, ServingTarget, desired
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
    formats: tuple[str, ...] = ("lora",)
    keep: int = 2
    poll_s: float = 0.5
    grace_s: float = 5.0
    gpu: str | None = None
    runs: tuple[
        str, ...
    ] = ()  # serve only these runs' checkpoints (an engine pool of its own); () serves all


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
        self.incarnation = uuid.uuid4().hex[:10]
        self.targets: list[ServingTarget] = []
        self.serving: dict[str, Served] = {}  # checkpoint name -> what it is
        self.failed: set[str] = set()
        self.last_failure: dict[str, str] | None = None
        self.retiring: dict[str, float] = {}  # checkpoint name -> when to unload it
        self.sleeping = False
        self._cursor = 0
        self._acks = 0
        self.requests = ServingRequests()

    async def run(self) -> None:
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
        if changed and not self.sleeping:
            await self.reconcile()
        await self._unload_retired()

    async def _read_targets(self) -> bool:
        changed = False
        while events := await self.ledger.read(SERVING_TARGETS, after=self._cursor):
            self._cursor = events[-1].seq
            for event in events:
                if event.kind != Kind.SERVING_TARGET:
                    continue
                target = ServingTarget.from_payload(dict(event.payload))
                if not self.config.runs or target.run in self.config.runs:
                    self.targets.append(target)
                    changed = True
        return changed

    async def reconcile(self) -> None:
        want = desired(self.targets, self.config.formats, self.config.keep, self.requests.wanted())
        wanted_names = {t.checkpoint for t in want}
        for target in want:  # newest first: the checkpoint turns are waiting for comes first
            if target.checkpoint in self.serving or target.checkpoint in self.failed:
                continue
            try:
                await self._load(target)
            except Exception as error:  # any failure to load keeps the previous checkpoints served
                log.warning("could not load %s: %s", target.checkpoint, error)
                self.failed.add(target.checkpoint)
                self.last_failure = {
                    "checkpoint": target.checkpoint,
                    "error": f"{type(error).__name__}: {error}",
                }
            else:
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

    def state(self) -> ServingAck:
        serving = tuple(sorted(self.serving.values(), key=lambda s: (s.policy, -s.version)))
        return ServingAck(
            engine=self.config.engine,
            url=self.config.url,
            incarnation=self.incarnation,
            n=self._acks,
            base=self.config.base,
            serving=serving,
            sleeping=self.sleeping,
            gpu=self.config.gpu,
            failed=self.last_failure,
        )

    async def ack(self) -> ServingAck:
        self._acks += 1
        ack = replace(self.state(), n=self._acks)
        await self.ledger.append_one(SERVING_ACKS, NewEvent(ack.key, Kind.SERVING_ACK, ack.to_payload()))
        return ack
