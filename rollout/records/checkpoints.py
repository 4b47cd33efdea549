"""The records of a checkpoint in the ledger: `CheckpointCreated` (`CheckpointRecord`, on
`policy/{policy}/checkpoints`) and `CheckpointConverted` (`CheckpointConverted`, its files in one serving
format, on `policy/{policy}/bridges`).

Contract: a checkpoint's name and its files' names come from the ledger, and engines and trainers join them to
their own folders: each record refuses (on read, as a bad payload) a name or a file name that is not a plain
relative path (`..`, absolute, a backslash, a control character: `rollout.blobs.checked_key`). A checkpoint's
`kind` is told by its files: `lora` (a peft adapter: `ADAPTER_FILES`), `tinker` (it lives in Tinker's
service: `TINKER_FILE` holds its paths) or `full` (full weights). Pure data; publishing and fetching are
rollout.training.checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rollout.blobs import BlobRef, checked_key
from rollout.records import Payload

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # a LoRA checkpoint's peft adapter
TINKER_FILE = "tinker.json"  # what a checkpoint trained by Tinker holds: its state and sampler paths
type CheckpointKind = Literal["lora", "full", "tinker"]


@dataclass(frozen=True)
class CheckpointFile(Payload):
    """One file of a checkpoint in the blob store: its key, and the reference its bytes are checked
    against."""

    key: str  # the blob store key
    uri: str
    sha256: str
    size: int

    @staticmethod
    def stored(key: str, ref: BlobRef) -> CheckpointFile:
        return CheckpointFile(key, ref.uri, ref.sha256, ref.size)

    @property
    def ref(self) -> BlobRef:
        return BlobRef(self.uri, self.sha256, self.size)


def checked_file_names(files: Mapping[str, object]) -> None:
    """Refuse a checkpoint file name that could leave the checkpoint's folder (`ValueError`)."""
    for name in files:
        checked_key(name, "a checkpoint's file name")


def checked_checkpoint_name(name: str) -> None:
    """Refuse a checkpoint name that is not a plain relative path (`ValueError`): it names blob prefixes and
    folders (`{run}/{policy}-step000003`)."""
    checked_key(name, "a checkpoint's name")


def files_of(payload: Mapping[str, Any]) -> dict[str, CheckpointFile]:
    """A payload's `files` (by path relative to the checkpoint directory), each checked."""
    return {str(name): CheckpointFile.from_payload(f) for name, f in payload.items()}


@dataclass(frozen=True)
class CheckpointRecord(Payload):
    """A `CheckpointCreated` (on `policy/{policy}/checkpoints`, keyed `step/{step}`)."""

    name: str
    policy: str
    version: int
    parent: str | None
    run: str
    files: dict[str, CheckpointFile]  # by path relative to the checkpoint directory
    metrics: dict[str, float] = field(default_factory=dict[str, float])

    def __post_init__(self) -> None:
        checked_checkpoint_name(self.name)
        checked_file_names(self.files)

    @property
    def kind(self) -> CheckpointKind:
        if TINKER_FILE in self.files:
            return "tinker"
        return "lora" if all(name in self.files for name in ADAPTER_FILES) else "full"


@dataclass(frozen=True)
class CheckpointConverted(Payload):
    """A checkpoint's files in one serving format (`lora`, `full`, `merged`, `tinker`), made by its bridge
    (on `policy/{policy}/bridges`, keyed `bridge/{version}/{format}`); `location` where the format is not
    files (a Tinker sampler path)."""

    name: str
    version: int
    format: str
    files: dict[str, CheckpointFile]
    location: str | None = None

    def __post_init__(self) -> None:
        checked_checkpoint_name(self.name)
        checked_file_names(self.files)
