"""GPU checks, for a machine with CUDA and vLLM (`uv run pytest -m gpu`); skipped without them.

The CPU counterparts: tests/test_engine_follow.py (the follower beside `engine serve --kind vllm`, with the
named fake vllm) and tests/test_one_gpu.py (one-GPU mode with the local engine's sleep and wake).
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
from rollout.records.serving import ServingAck
from rollout.run.settings import RunStatus
from rollout.stack.engine import has_cuda_gpu
from rollout.workflows.names import run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout_testing.cluster import Cluster
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


@pytest.mark.timeout(900)
def test_the_qlora_trainer_steps_in_four_bits_and_frees_the_gpu_between_steps(tiny_qwen3: str) -> None:
    """trainer.quantization=nf4 on CUDA: a step runs on the 4-bit base; offload leaves (almost) nothing on the
    device, onload brings it back, and the next step still works (the optimiser state moved with it)."""
    import torch

    from benchmarks.gpu import synthetic_batch
    from rollout.rl.losses import PPO, LossConfig
    from rollout.training.local import LocalTrainer, LocalTrainerConfig

    config = LocalTrainerConfig(lora_rank=8, lora_alpha=16, device="cuda", quantization="nf4")
    trainer = LocalTrainer(tiny_qwen3, config, LossConfig(PPO()))
    assert any("4bit" in type(m).__name__ for m in trainer.model.modules()), "the base is quantized"
    batch = synthetic_batch(trainer.model.config.vocab_size)
    trainer.step(batch)
    on_device = torch.cuda.memory_allocated()
    trainer.offload()
    assert torch.cuda.memory_allocated() < on_device / 10, "offload frees the device for the engine"
    trainer.onload()
    metrics = trainer.step(batch)
    assert metrics["step"] == 2.0 and metrics["tokens"] > 0
