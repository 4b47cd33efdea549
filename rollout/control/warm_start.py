"""`rollout sft`: a supervised warm start (TRL) published as a checkpoint a run can train from.

Contract:
- The adapter is trained by `rollout.training.sft` and published as step 1 of policy `sft/{name}` (checkpoint
  `sft/{name}-step000001`), in the blob store and the ledger like any checkpoint, fenced by the lease
  `trainer/sft/{name}` held for the publish.
- A name is published once: a second warm start under a name that exists is refused before anything trains
  (`WarmStartExists`), so a run that named it always trains from the same weights.
- A run trains from it with `trainer.warm_start=sft/{name}-step000001`: its first step's parent is that
  checkpoint (looked up in its own lineage, `rollout.training.checkpoints.find_checkpoint`).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from rollout.blobs import BlobStore
from rollout.ledger import Kind, Ledger
from rollout.ledger.streams import policy_checkpoints_stream, trainer_lease
from rollout.records.checkpoints import CheckpointRecord
from rollout.training.checkpoints import checkpoint_name, publish_checkpoint
from rollout.training.sft import SftConfig, sft_warm_start

SFT_RUN = "sft"


class WarmStartExists(ValueError):
    """A warm start was already published under this name."""


def warm_start_policy(name: str) -> str:
    return f"sft/{name}"


async def published(ledger: Ledger, name: str) -> CheckpointRecord | None:
    for event in await ledger.read(policy_checkpoints_stream(warm_start_policy(name))):
        if event.kind == Kind.CHECKPOINT_CREATED:
            return CheckpointRecord.from_payload(dict(event.payload))
    return None


async def warm_start(
    ledger: Ledger,
    store: BlobStore,
    *,
    name: str,
    model_path: str,
    rows: list[dict[str, Any]],
    config: SftConfig,
    holder: str,
    scratch: Path | None = None,
) -> CheckpointRecord:
    """Train the adapter on `rows` and publish it; the published checkpoint."""
    policy = warm_start_policy(name)
    if (existing := await published(ledger, name)) is not None:
        raise WarmStartExists(f"a warm start named {name!r} exists ({existing.name}): choose another --name")
    with tempfile.TemporaryDirectory(prefix="rollout-sft-", dir=scratch) as work:
        directory = Path(work) / "adapter"
        metrics = await asyncio.to_thread(sft_warm_start, model_path, rows, directory, config)
        lease = await ledger.claim(trainer_lease(policy), holder, 600.0)
        if lease is None:
            raise WarmStartExists(f"another process is publishing the warm start {name!r}")
        try:
            return await publish_checkpoint(
                ledger,
                store,
                lease.fence,
                run=SFT_RUN,
                policy=policy,
                step=1,
                parent=None,
                directory=directory,
                metrics=metrics,
            )
        finally:
            await ledger.release(lease)


def warm_start_name(name: str) -> str:
    """The checkpoint a run names in `trainer.warm_start=`."""
    return checkpoint_name(warm_start_policy(name), 1)
