"""One-GPU mode on CPU: the engine and the trainer pass the device back and forth through the ledger's GPU
lease, on a full-weight run (each checkpoint served as a model of its own).

The local engine's sleep and wake stand in for vLLM's (level 1: weights kept in CPU memory). Real Temporal,
Postgres, HTTP, a tiny model that samples and trains; the order of what happened is read back from the ledger.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from pathlib import Path

from rollout.config import Settings
from rollout.ledger import Kind, Ledger
from rollout.ledger.streams import SERVING_ACKS, policy_checkpoints_stream
from rollout.records.serving import ServingAck
from rollout.run.settings import RunStatus
from rollout.workflows.names import run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from tests.test_training_loop import run_input, training_loop, turns_of_run

# A turn recorded this long after its engine's sleep ack may still have been sampled before it (the response
# was on its way, on two busy cores); one recorded later, and before the wake, was sampled asleep.
RECORDING_SLACK = timedelta(seconds=1.5)


async def test_shared_gpu_the_engine_sleeps_for_each_full_weight_step_wakes_to_its_checkpoint_and_no_turn_is_lost(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    gpu = f"gpu-{uuid.uuid4().hex[:6]}"
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path, gpu=gpu, lora_rank=0) as loop:
        status: RunStatus = await asyncio.wait_for(
            loop.client.execute_workflow(
                RunWorkflow.run,
                run_input(loop, 3, serve_formats=("merged",)),
                id=run_workflow_id(loop.run),
                task_queue=loop.queue,
            ),
            300,
        )
        assert not loop.engine.sleeping, "the engine is awake once the last step is done"
        policy = run_policy(loop.run, "default")
        assert f"{policy}-step000003" in loop.engine.full, "full weights are served as a model of their own"
        assert not loop.engine.adapters
    assert status.trained == {"default": f"{policy}-step000003"}
    assert status.episodes_failed == 0 and status.episodes_finished > 0, "no episode lost a turn"

    acks = [
        (e.recorded_at, ServingAck.from_payload(dict(e.payload)))
        for e in await ledger.read(SERVING_ACKS, limit=100000)
        if e.payload.get("gpu") == gpu
    ]
    created = [
        (e.recorded_at, e.payload["name"])
        for e in await ledger.read(policy_checkpoints_stream(policy))
        if e.kind == Kind.CHECKPOINT_CREATED
    ]
    assert len(created) == 3
    for at, checkpoint in created:
        before = [ack for when, ack in acks if when < at]
        after = [(when, ack) for when, ack in acks if when > at]
        assert before and before[-1].sleeping, f"the engine slept while {checkpoint} was trained"
        woke = next(when for when, ack in after if not ack.sleeping)
        loaded = next(when for when, ack in after if ack.serves(checkpoint))
        assert woke <= loaded, f"sleep → step ({checkpoint}) → wake → load, in that order"

    asleep = _asleep_intervals(acks)
    assert len(asleep) >= 3, "the engine slept once per step"
    turns = await turns_of_run(ledger, loop.run)
    assert turns and not any(t.get("aborted") for t in turns)
    for turn in turns:
        recorded: datetime = turn["recorded_at"]
        assert not any(start + RECORDING_SLACK < recorded < end for start, end in asleep), (
            f"turn {turn['turn_index']} of seat {turn['seat']} was recorded at {recorded}, while the engine slept"
        )


def _asleep_intervals(acks: list[tuple[datetime, ServingAck]]) -> list[tuple[datetime, datetime]]:
    """[sleep ack, next wake ack) for each time the engine slept."""
    intervals: list[tuple[datetime, datetime]] = []
    fell_asleep: datetime | None = None
    for when, ack in acks:
        if ack.sleeping and fell_asleep is None:
            fell_asleep = when
        elif not ack.sleeping and fell_asleep is not None:
            intervals.append((fell_asleep, when))
            fell_asleep = None
    return intervals
