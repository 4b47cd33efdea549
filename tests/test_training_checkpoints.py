"""Checkpoints: blobs then one fenced `CheckpointCreated` per step; a zombie trainer cannot publish."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rollout.blobs import BlobIntegrityError, FileBlobStore
from rollout.ledger import Kind, Ledger, StaleFenceError
from rollout.ledger.queries import newest_checkpoint_version
from rollout.ledger.streams import policy_checkpoints_stream, trainer_lease
from rollout.training.checkpoints import fetch_checkpoint, lineage_version, publish_checkpoint


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


def test_staleness_counts_from_the_parent_in_its_own_lineage() -> None:
    # A step after one skipped for no signal trains from an older parent: staleness counts from that parent.
    assert lineage_version("r/default", "r/default-step000003") == 3
    assert lineage_version("r/default", None) == 0  # the base model
    assert lineage_version("r/default", "sft/warm-step000001") == 0  # a warm start: agents sampled version 0
    assert lineage_version("r/default", "r/default-other") == 0
