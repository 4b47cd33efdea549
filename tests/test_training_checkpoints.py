"""Checkpoints: blobs then one fenced `CheckpointCreated` per step; a zombie trainer cannot publish."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from rollout.activities.bridges import BridgeActivities
from rollout.blobs import BlobIntegrityError, FileBlobStore
from rollout.ledger import Kind, Ledger, NewEvent, StaleFenceError
from rollout.ledger.queries import newest_checkpoint_version
from rollout.ledger.streams import (
    SERVING_TARGETS,
    policy_bridges_stream,
    policy_checkpoints_stream,
    trainer_lease,
)
from rollout.records.checkpoints import CheckpointFile, CheckpointRecord
from rollout.records.serving import ServingTarget
from rollout.training.checkpoints import (
    ForeignCheckpoint,
    download_files,
    fetch_checkpoint,
    lineage_version,
    publish_checkpoint,
)
from rollout.workflows.training_types import BridgeInput


def checkpoint_dir(root: Path, content: bytes) -> Path:
    (root / "nested").mkdir(parents=True)
    (root / "adapter_model.safetensors").write_bytes(content)
    (root / "nested" / "trainer.json").write_text('{"steps": 1}')
    return root


async def test_one_checkpoint_per_step_and_a_zombie_cannot_publish(ledger: Ledger, tmp_path: Path) -> None:
    policy = f"pol-{uuid.uuid4().hex[:8]}"
    store = FileBlobStore(tmp_path / "blobs")
    first = await ledger.claim(trainer_lease(policy), "trainer-a", ttl_s=30)
    assert first is not None
    step_1 = await publish_checkpoint(
        ledger,
        store,
        first.fence,
        run="r",
        policy=policy,
        step=1,
        parent=None,
        directory=checkpoint_dir(tmp_path / "a1", b"weights-1"),
        metrics={"loss": 0.5},
    )
    assert (step_1.name, step_1.version, step_1.parent) == (f"{policy}-step000001", 1, None)

    await ledger.release(first)  # trainer-a stalls; trainer-b takes over the policy
    second = await ledger.claim(trainer_lease(policy), "trainer-b", ttl_s=30)
    assert second is not None and second.epoch > first.epoch
    with pytest.raises(StaleFenceError):
        await publish_checkpoint(
            ledger,
            store,
            first.fence,
            run="r",
            policy=policy,
            step=2,
            parent=step_1.name,
            directory=checkpoint_dir(tmp_path / "zombie", b"zombie"),
        )
    step_2 = await publish_checkpoint(
        ledger,
        store,
        second.fence,
        run="r",
        policy=policy,
        step=2,
        parent=step_1.name,
        directory=checkpoint_dir(tmp_path / "b2", b"weights-2"),
    )
    retried = await publish_checkpoint(
        ledger,
        store,
        second.fence,
        run="r",
        policy=policy,
        step=2,
        parent=step_1.name,
        directory=checkpoint_dir(tmp_path / "b2-again", b"other"),
    )
    assert retried == step_2, "a retried step returns the checkpoint already published"
    created = [
        e for e in await ledger.read(policy_checkpoints_stream(policy)) if e.kind == Kind.CHECKPOINT_CREATED
    ]
    assert [e.key for e in created] == ["step/1", "step/2"]
    assert created[1].payload["parent"] == step_1.name, "the checkpoint tree records each parent"
    assert await newest_checkpoint_version(ledger, policy) == 2, "what the gateway's admission reads"

    fetched = fetch_checkpoint(store, step_2, tmp_path / "fetched")
    assert (fetched / "adapter_model.safetensors").read_bytes() == b"weights-2"
    assert (fetched / "nested" / "trainer.json").read_text() == '{"steps": 1}'
    (tmp_path / "blobs" / step_2.files["adapter_model.safetensors"].key).write_bytes(b"tampered")
    with pytest.raises(BlobIntegrityError):
        fetch_checkpoint(store, step_2, tmp_path / "again")


async def test_a_step_someone_else_wrote_first_is_never_adopted(ledger: Ledger, tmp_path: Path) -> None:
    """Any worker may append to a policy's checkpoint stream before its trainer fenced it: a forged `step/1`
    written there first must not become the step's checkpoint (engines would serve its files)."""
    policy = f"pol-{uuid.uuid4().hex[:8]}"
    store = FileBlobStore(tmp_path / "blobs")
    forged = {"name": f"{policy}-step000001", "policy": policy, "version": 1, "parent": None, "run": "r"}
    forged["files"] = {
        "adapter_model.safetensors": {"key": "attacker/adapter", "sha256": "0" * 64, "size": 1}
    }
    await ledger.append_one(
        policy_checkpoints_stream(policy), NewEvent("step/1", Kind.CHECKPOINT_CREATED, forged)
    )
    lease = await ledger.claim(trainer_lease(policy), "trainer-a", ttl_s=30)
    assert lease is not None
    with pytest.raises(ForeignCheckpoint, match="not holding the lease"):
        await publish_checkpoint(
            ledger,
            store,
            lease.fence,
            run="r",
            policy=policy,
            step=1,
            parent=None,
            directory=checkpoint_dir(tmp_path / "a1", b"weights-1"),
        )


async def test_a_bridge_someone_else_recorded_is_never_signed_for_the_engines(
    ledger: Ledger, tmp_path: Path
) -> None:
    """The bridge stream takes any writer's appends: a `bridge/N/lora` recorded first, naming files of the
    forger's choosing, must not become a serving target the trainer signs (engines load what it signs)."""
    policy = f"pol-{uuid.uuid4().hex[:8]}"
    name = f"{policy}-step000001"
    forged = {
        "name": name,
        "version": 1,
        "format": "lora",
        "files": {"adapter_model.safetensors": {"key": "attacker/adapter", "sha256": "0" * 64, "size": 1}},
        "location": None,
    }
    await ledger.append_one(
        policy_bridges_stream(policy), NewEvent("bridge/1/lora", Kind.CHECKPOINT_CONVERTED, forged)
    )
    bridges = BridgeActivities(
        ledger, FileBlobStore(tmp_path / "blobs"), base_model=None, scratch=tmp_path, serving_key=b"k" * 64
    )
    given = BridgeInput(run="r", policy=policy, checkpoint=name, version=1, format="lora")
    with pytest.raises(ApplicationError, match="names files that are not") as refused:
        await ActivityEnvironment().run(bridges.publish_serving, given)
    assert refused.value.type == "ForeignBridge" and refused.value.non_retryable
    assert not [e for e in await ledger.read(SERVING_TARGETS) if e.payload.get("checkpoint") == name]


def test_staleness_counts_from_the_parent_in_its_own_lineage() -> None:
    # A step after one skipped for no signal trains from an older parent: staleness counts from that parent.
    assert lineage_version("r/default", "r/default-step000003") == 3
    assert lineage_version("r/default", None) == 0  # the base model
    assert lineage_version("r/default", "sft/warm-step000001") == 0  # a warm start: agents sampled version 0
    assert lineage_version("r/default", "r/default-other") == 0


def test_checkpoint_and_file_names_read_from_the_ledger_cannot_leave_their_folders(tmp_path: Path) -> None:
    """A writer of the ledger names a checkpoint's files; engines and trainers join those names to their own
    folders. Names that would escape are refused where the payload is read, and downloads stay inside."""
    store = FileBlobStore(tmp_path / "blobs")
    good = CheckpointFile.stored("checkpoints/c/w.bin", store.put("checkpoints/c/w.bin", b"weights"))
    record = {"name": "r/default-step000001", "policy": "r/default", "version": 1, "parent": None, "run": "r"}
    assert CheckpointRecord.from_payload({**record, "files": {"nested/w.bin": good.to_payload()}})
    for name, files in (
        ("r/default-step000001", {"../../.bashrc": good}),
        ("r/default-step000001", {"/etc/cron.d/x": good}),
        ("r/default-step000001", {"a\\..\\..\\x": good}),
        ("../../outside", {"w.bin": good}),
    ):
        payload = {**record, "name": name, "files": {n: f.to_payload() for n, f in files.items()}}
        with pytest.raises(ValueError, match="must be a relative path of plain names"):
            CheckpointRecord.from_payload(payload)
        target = {"policy": "r/default", "checkpoint": name, "version": 1, "run": "r", "format": "lora"}
        with pytest.raises(ValueError, match="must be a relative path of plain names"):
            ServingTarget.from_payload({**target, "files": payload["files"]})
    with pytest.raises(ValueError, match="format"):
        ServingTarget.from_payload({**target, "checkpoint": "r/c", "format": "../lora", "files": {}})
    # A folder that holds a symbolic link out of it is not written through.
    folder, outside = tmp_path / "cache", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (folder / "nested").symlink_to(outside)
    with pytest.raises(ValueError, match="outside"):
        download_files(store, {"nested/w.bin": good}, folder)
    assert not list(outside.iterdir())
    assert (download_files(store, {"w.bin": good}, folder) / "w.bin").read_bytes() == b"weights"
