"""GPU checks, for a machine with CUDA and vLLM (`uv run pytest -m gpu`); skipped without them.

The CPU counterparts: tests/test_engine_follow.py (the follower beside `engine serve --kind vllm`, with the named
fake vllm) and tests/test_one_gpu.py (one-GPU mode with the local engine's sleep and wake).
"""

from __future__ import annotations

import asyncio
import importlib.util
import uuid

import pytest
from temporalio.client import Client

from rollout.config import Settings
from rollout.ledger import Kind, Ledger
from rollout.ledger.streams import SERVING_ACKS, policy_checkpoints_stream
from rollout.serving import ServingAck
from rollout.stack.engine import has_cuda_gpu
from rollout.workflows.names import run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.types import RunStatus, run_policy
from tests.cluster import Cluster
from tests.test_chaos_training import training_run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(
        not has_cuda_gpu() or importlib.util.find_spec("vllm") is None, reason="needs vLLM and a CUDA GPU"
    ),
]


@pytest.mark.timeout(1500)
async def test_vllm_follows_three_checkpoints_of_a_lora_run_sleeping_while_each_step_trains_on_the_same_gpu(
    cluster: Cluster, stack_settings: Settings, ledger: Ledger
) -> None:
    gpu = f"gpu-{uuid.uuid4().hex[:6]}"
    name = f"vllm-{gpu}"
    _, engine_url = cluster.vllm_engine(
        name,
        "--gpu",
        gpu,
        "services.engine.vllm_gpu_memory_utilization=0.3",
        "services.engine.vllm_max_lora_rank=8",
        "services.gateway.max_context=2048",
        timeout_s=900,
    )
    gateway_url = cluster.gateway(engine_url)
    cluster.runner("runner-gpu", gateway_url)
    trainer_queue = f"{cluster.task_queue}-trainer"
    cluster.trainer("trainer-gpu", trainer_queue, f"trainer.gpu_lease={gpu}", "trainer.device=cuda")
    client = await Client.connect(stack_settings.temporal_address)
    run = f"gpu-{uuid.uuid4().hex[:6]}"
    status: RunStatus = await asyncio.wait_for(
        client.execute_workflow(
            RunWorkflow.run,
            training_run(run, 3, trainer_queue),
            id=run_workflow_id(run),
            task_queue=cluster.task_queue,
        ),
        1200,
    )
    policy = run_policy(run, "default")
    assert status.trained == {"default": f"{policy}-step000003"} and status.episodes_failed == 0
    created = [
        (e.recorded_at, e.payload["name"])
        for e in await ledger.read(policy_checkpoints_stream(policy))
        if e.kind == Kind.CHECKPOINT_CREATED
    ]
    acks = [
        (e.recorded_at, ServingAck.from_payload(dict(e.payload)))
        for e in await ledger.read(SERVING_ACKS, limit=100000)
        if e.payload.get("engine") == name
    ]
    for at, checkpoint in created:
        before = [ack for when, ack in acks if when < at]
        assert before and before[-1].sleeping, f"vLLM slept while {checkpoint} was trained"
        assert any(ack.serves(checkpoint) for when, ack in acks if when > at), f"vLLM served {checkpoint}"
    assert all(ack.failed is None for _, ack in acks)
