"""Bridge and serving activities: a checkpoint converted for the engines, its serving target, waiting for
acks.

Contract:
- `bridge_checkpoint` is idempotent per (checkpoint, format): the first attempt converts
  (rollout.training.bridges) and records `CheckpointConverted` on `policy/{policy}/bridges` under
  `bridge/{version}/{format}` (not on the checkpoint stream, which only the trainer's lease may write); a
  retry returns that record. A format the checkpoint cannot give fails for good (`BridgeError`). A merge is
  onto the policy's own base model when it has one (`BridgeInput.model`), else the trainer's.
- `publish_serving` appends the `ServingTarget` for a converted checkpoint (once per checkpoint and serving
  format), naming its base model and signed with `serving_key` (engines load only signed targets when they
  hold the engine key: rollout.serving); followers beside engines serving that model load it. The bridge
  stream takes anyone's appends, so a record whose files are not the checkpoint's own blobs or its bridge's
  (`checkpoints/POLICY/NAME/…`, `bridges/POLICY/NAME/…`) is never signed: `ForeignBridge`, for good.
- `wait_served` waits (heartbeating) until some engine's newest ack serves the checkpoint, or the time is up
  (False). Nothing here blocks turns: admission reads acks on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollout.activities.heartbeat import heartbeating
from rollout.blobs import BlobStore
from rollout.ledger import KeyConflictError, Kind, Ledger, NewEvent, RecordedEvent
from rollout.ledger.records import records_of
from rollout.ledger.streams import SERVING_TARGETS, policy_bridges_stream
from rollout.records.checkpoints import CheckpointConverted
from rollout.records.serving import ServingTarget
from rollout.serving.states import EngineStates
from rollout.training.bridges import BridgeError, bridge_files, bridge_location
from rollout.training.checkpoints import find_checkpoint, policy_of
from rollout.workflows import trainer_stubs
from rollout.workflows.training_types import BridgeInput, BridgeResult, ServedWait

SERVING_FORMAT = {"lora": "lora", "full": "full", "merged": "full", "tinker": "tinker"}


def _check_bridge(given: BridgeInput, event: RecordedEvent) -> CheckpointConverted:
    """A bridge record is on a stream any ledger writer may append to: it is signed into a serving target only
    when it is a bridge record, this checkpoint's, and every file it names is one of the checkpoint's own
    blobs or its bridge's (`checkpoints/POLICY/NAME/…`, `bridges/POLICY/NAME/…`)."""
    name, lineages = given.checkpoint, {given.policy, policy_of(given.checkpoint)}
    prefixes = tuple(f"{top}/{p}/{name}/" for top in ("checkpoints", "bridges") for p in lineages)
    bridged = next(iter(records_of([event], CheckpointConverted)), None)
    if (
        bridged is None
        or bridged.name != name
        or not bridged.files
        or not all(f.key.startswith(prefixes) for f in bridged.files.values())
    ):
        raise ApplicationError(
            f"the {given.format} bridge recorded for {name} names files that are not {name}'s: another writer "
            "recorded it first; nothing is served from it",
            type="ForeignBridge",
            non_retryable=True,
        )
    return bridged


def _bridge_key(given: BridgeInput) -> str:
    return f"bridge/{given.version}/{given.format}"


class BridgeActivities:
    def __init__(
        self,
        ledger: Ledger,
        store: BlobStore,
        *,
        base_model: str | None,
        scratch: Path,
        model: str = "",
        resolve: Callable[[str], str] | None = None,
        serving_key: bytes | None = None,
    ) -> None:
        self.ledger, self.store, self.base_model, self.scratch = ledger, store, base_model, scratch
        self.serving_key = serving_key  # what targets are signed with (rollout.serving.keys.load_serving_key)
        self.model = model  # the spec of `base_model` (the path): what its serving targets name
        self.resolve = resolve  # a policy's own model spec -> its path, to merge onto

    @activity.defn(name=trainer_stubs.bridge_checkpoint.__name__)
    async def bridge_checkpoint(self, given: BridgeInput) -> BridgeResult:
        async with heartbeating():  # a conversion can take minutes; only a dead worker stops the heartbeat
            return await self._bridge(given)

    async def _bridge(self, given: BridgeInput) -> BridgeResult:
        stream = policy_bridges_stream(given.policy)
        recorded = await self.ledger.find(stream, _bridge_key(given))
        if recorded is None:
            record = await find_checkpoint(self.ledger, given.policy, given.checkpoint)
            if record is None:
                raise ApplicationError(
                    f"checkpoint {given.checkpoint!r} is not in the ledger", non_retryable=True
                )
            try:
                base = self.base_model
                if given.model is not None and given.model != self.model and self.resolve is not None:
                    base = await asyncio.to_thread(self.resolve, given.model)
                files = await asyncio.to_thread(
                    bridge_files, record, given.format, self.store, base, self.scratch
                )
                location = await asyncio.to_thread(bridge_location, record, given.format, self.store)
            except BridgeError as error:
                raise ApplicationError(str(error), type="BridgeError", non_retryable=True) from error
            converted = CheckpointConverted(record.name, record.version, given.format, files, location)
            try:
                recorded = await self.ledger.append_one(
                    stream, NewEvent(_bridge_key(given), Kind.CHECKPOINT_CONVERTED, converted.to_payload())
                )
            except KeyConflictError:  # a racing attempt recorded first; its files are the bridge
                recorded = await self.ledger.find(stream, _bridge_key(given))
                assert recorded is not None
        bridged = records_of([recorded], CheckpointConverted)
        return BridgeResult(
            given.format, SERVING_FORMAT[given.format], len(bridged[0].files) if bridged else 0
        )

    @activity.defn(name=trainer_stubs.publish_serving.__name__)
    async def publish_serving(self, given: BridgeInput) -> None:
        async with heartbeating():
            await self._publish(given)

    async def _publish(self, given: BridgeInput) -> None:
        converted = await self.ledger.find(policy_bridges_stream(given.policy), _bridge_key(given))
        if converted is None:
            raise ApplicationError(f"{given.checkpoint} has no {given.format} bridge yet", non_retryable=True)
        bridged = _check_bridge(given, converted)  # what it names is signed next: engines will load it
        target = ServingTarget(
            policy=given.policy,
            checkpoint=given.checkpoint,
            version=given.version,
            run=given.run,
            format=SERVING_FORMAT[given.format],
            files=bridged.files,
            location=bridged.location,
            model=given.model or self.model,
        )
        if self.serving_key is not None:
            target = target.signed(self.serving_key)
        # A conflict: the same checkpoint, targeted by an earlier attempt (or in another format bridged to
        # it).
        with contextlib.suppress(KeyConflictError):
            await self.ledger.append_one(
                SERVING_TARGETS, NewEvent(target.key, Kind.SERVING_TARGET, target.to_payload())
            )

    @activity.defn(name=trainer_stubs.wait_served.__name__)
    async def wait_served(self, given: ServedWait) -> bool:
        deadline = time.monotonic() + given.timeout_s
        states = EngineStates()
        while True:
            await states.refresh(self.ledger)
            if any(ack.serves(given.checkpoint) for ack in states.values()):
                return True
            if time.monotonic() >= deadline:
                return False
            activity.heartbeat()
            await asyncio.sleep(0.5)
