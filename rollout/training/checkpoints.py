"""Publishing checkpoints: files into the blob store, then one fenced `CheckpointCreated` in the ledger.

Contract:
- A checkpoint is a directory (a peft adapter, or full weights, with the optimiser state). Its name and
  version come from the step's business key: `{policy}-step{step:06d}`, version = step. Its parent is the
  checkpoint the step trained from (None for the base model), so resuming from an older checkpoint branches
  the tree.
- `publish_checkpoint` uploads every file under a prefix of its own lease epoch (a zombie's uploads can never
  overwrite the live attempt's), then appends `CheckpointCreated` on `policy/{policy}/checkpoints` under key
  `step/{step}`, fenced by the trainer's lease. A zombie (an older epoch) gets `StaleFenceError` and nothing
  is published; a retry of a step that was already published returns the recorded checkpoint (exactly one
  `CheckpointCreated` per step), but only one a holder of the same lease wrote: a `step/{step}` anyone else
  appended first (unfenced, before the stream was fenced) raises `ForeignCheckpoint` and is never adopted. The
  gateway's admission reads `version` from these events.
- `fetch_checkpoint` downloads a recorded checkpoint and verifies every file's hash.
- A checkpoint's name and its files' names come from the ledger, and engines and trainers join them to their
  own folders: `CheckpointRecord` (rollout.records.checkpoints) refuses (on read, as a bad payload) a name or
  a file name that is not a plain relative path (`..`, absolute, a backslash, a control character:
  `rollout.blobs.checked_key`), and `download_files` writes nothing outside its directory, a symbolic link
  there included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from rollout.blobs import BlobStore, checked_key
from rollout.ledger import Fence, KeyConflictError, Kind, Ledger, NewEvent
from rollout.ledger.queries import checkpoint_payload, written_under
from rollout.ledger.streams import policy_checkpoints_stream
from rollout.records.checkpoints import CheckpointFile, CheckpointRecord


def checkpoint_name(policy: str, step: int) -> str:
    return f"{policy}-step{step:06d}"


def lineage_version(policy: str, checkpoint: str | None) -> int:
    """The version `checkpoint` has in `policy`'s lineage: its step when it is one of the lineage's own, else
    0 (the base model, or a checkpoint of another lineage such as a warm start, which the lineage's agents
    never sampled from: they sample version 0 until the lineage's first step is served)."""
    prefix = f"{policy}-step"
    if checkpoint is None or not checkpoint.startswith(prefix) or not checkpoint[len(prefix) :].isdigit():
        return 0
    return int(checkpoint[len(prefix) :])


def _key(record_name: str, policy: str, epoch: int, relative: str) -> str:
    return f"checkpoints/{policy}/{record_name}/epoch-{epoch}/{relative}"


def _upload(store: BlobStore, directory: Path, key_of: Callable[[str], str]) -> dict[str, CheckpointFile]:
    files: dict[str, CheckpointFile] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            relative = path.relative_to(directory).as_posix()
            files[relative] = CheckpointFile.stored(
                key_of(relative), store.put(key_of(relative), path.read_bytes())
            )
    return files


async def publish_checkpoint(
    ledger: Ledger,
    store: BlobStore,
    fence: Fence,
    *,
    run: str,
    policy: str,
    step: int,
    parent: str | None,
    directory: Path,
    metrics: dict[str, float] | None = None,
) -> CheckpointRecord:
    name = checkpoint_name(policy, step)
    stream, key = policy_checkpoints_stream(policy), f"step/{step}"
    if (published := await published_step(ledger, policy, step, fence.resource)) is not None:
        return published
    files = await asyncio.to_thread(
        _upload, store, directory, lambda relative: _key(name, policy, fence.epoch, relative)
    )
    if not files:
        raise ValueError(f"checkpoint directory {directory} is empty")
    record = CheckpointRecord(
        name=name,
        policy=policy,
        version=step,
        parent=parent,
        run=run,
        files=files,
        metrics=dict(metrics or {}),
    )
    try:
        await ledger.append_one(
            stream, NewEvent(key, Kind.CHECKPOINT_CREATED, record.to_payload()), fence=fence
        )
    except KeyConflictError:
        # An earlier attempt of this step published first: its checkpoint is the step's one.
        published = await published_step(ledger, policy, step, fence.resource)
        assert published is not None
        return published
    return record


class ForeignCheckpoint(RuntimeError):
    """A step's checkpoint event is on the ledger, but no holder of the trainer's lease wrote it."""


async def published_step(ledger: Ledger, policy: str, step: int, lease: str) -> CheckpointRecord | None:
    """Step `step`'s checkpoint of `policy` as a holder of the trainer's lease `lease` published it; None
    when there is none; `ForeignCheckpoint` when someone else wrote it first (never adopted as the step's)."""
    stream, key = policy_checkpoints_stream(policy), f"step/{step}"
    published = await ledger.find(stream, key)
    if published is None:
        return None
    if not await written_under(ledger, stream, key, lease):
        raise ForeignCheckpoint(
            f"{key} on {stream} was written by a writer not holding the lease {lease!r}: the ledger "
            "holds a forged checkpoint; find who wrote it (its login) before training this policy further"
        )
    return CheckpointRecord.from_payload(published.payload)


def policy_of(name: str) -> str:
    """The policy a checkpoint name belongs to (names are `{policy}-step{step:06d}`)."""
    return name.rsplit("-step", 1)[0]


async def find_checkpoint(ledger: Ledger, policy: str, name: str) -> CheckpointRecord | None:
    """The checkpoint `name` of `policy`'s lineage, or of the lineage it names (a warm start trained
    elsewhere: an SFT checkpoint a run's first step trains from)."""
    for lineage in dict.fromkeys((policy, policy_of(name))):
        payload = await checkpoint_payload(ledger, lineage, name)
        if payload is not None:
            return CheckpointRecord.from_payload(payload)
    return None


def fetch_checkpoint(store: BlobStore, record: CheckpointRecord, directory: Path) -> Path:
    """Download `record` into `directory` (verifying every file's hash); returns the directory."""
    return download_files(store, record.files, directory)


def download_files(store: BlobStore, files: dict[str, CheckpointFile], directory: Path) -> Path:
    """Download recorded files (relative path -> blob) into `directory`, verifying every hash."""
    root = directory.resolve()
    for relative, file in files.items():
        target = directory / checked_key(relative, "a checkpoint's file name")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.resolve().is_relative_to(root):  # a symbolic link in the folder points out of it
            raise ValueError(f"a checkpoint's file {relative!r} would be written outside {directory}")
        target.write_bytes(store.get(file.key, expected=file.ref))
    return directory
