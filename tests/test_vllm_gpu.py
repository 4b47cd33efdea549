"""vLLM on a GPU, through rollout's client, as the one-GPU mode drives it (`pytest -m gpu`; skipped without
vLLM and a CUDA device; scripts/gpu_check.sh runs these with the other GPU checks).

One `vllm serve` of the shipped tiny Qwen3, started with exactly the launcher's argv, serves the module:
- a LoRA adapter trained here changes the fixed-seed output, and still does after a sleep and a wake;
- `sleep` lets a stream in flight finish (never `abort`), and a request sent while vLLM sleeps is refused at
  once (`EngineUnavailable`, the gateway's cue to hold the turn), not queued until the wake;
- a stream cut short by vLLM's own `/sleep?mode=abort` raises `EngineUnavailable` after its first tokens: the
  gateway records such a turn aborted and never trains it (tests/test_vllm_client_streaming.py shows what the
  client does with each finish reason; tests/test_gateway_streaming.py what the gateway records).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from rollout.engines.protocol import CheckpointRef, EngineUnavailable, SampleRequest
from rollout.engines.vllm_client import VLLMEngine
from rollout.engines.vllm_launcher import VLLMLaunch, command
from rollout.net import free_port
from rollout.serving.keys import engine_api_key
from rollout.stack.engine import has_cuda_gpu
from scripts.gpu_check import batch_for, changed, trainer_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(
        not has_cuda_gpu() or importlib.util.find_spec("vllm") is None, reason="needs vLLM and a CUDA GPU"
    ),
]

PROMPT = (151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198)
API_KEY = engine_api_key(b"gpu-test-engine-key")


def _trained_adapter(model: str, directory: Path) -> None:
    """Five steps of rank-8 LoRA at a large learning rate: enough to move a random tiny model's samples."""
    from rollout.rl.losses import LossConfig
    from rollout.training.local import LocalTrainer

    trainer = LocalTrainer(model, trainer_config(), LossConfig())
    batch = batch_for(trainer.model.config.vocab_size)
    for _ in range(5):
        trainer.step(batch)
    trainer.model.save_pretrained(directory)
    del trainer


@pytest.fixture(scope="module")
async def vllm(tiny_qwen3: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VLLMEngine]:
    port = free_port()
    argv, env = command(
        VLLMLaunch(
            tiny_qwen3,
            port=port,
            gpu_memory_utilization=0.3,
            max_model_len=2048,
            max_lora_rank=8,
            api_key=API_KEY,
        )
    )
    log = (tmp_path_factory.mktemp("vllm") / "vllm.log").open("wb")
    server = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **env}, stdout=log, stderr=log)
    client = VLLMEngine(f"http://127.0.0.1:{port}", api_key=API_KEY)
    try:
        deadline = time.monotonic() + 600
        while not await client.health():
            assert server.returncode is None, f"vllm serve exited; its output is in {log.name}"
            assert time.monotonic() < deadline, f"vllm serve did not come up; its output is in {log.name}"
            await asyncio.sleep(2)
        yield client
    finally:
        await client.close()
        server.terminate()
        await server.wait()
        log.close()


async def test_an_adapter_changes_the_fixed_seed_output_and_still_does_after_sleep_and_wake(
    vllm: VLLMEngine, tiny_qwen3: str, tmp_path: Path
) -> None:
    adapter = tmp_path / "step1"
    await asyncio.to_thread(_trained_adapter, tiny_qwen3, adapter)
    base = await vllm.sample(SampleRequest(PROMPT, max_tokens=16, seed=3))
    await vllm.load(CheckpointRef("step1", str(adapter)))
    tuned = await vllm.sample(SampleRequest(PROMPT, max_tokens=16, seed=3, model="step1"))
    assert changed(base, tuned), "the adapter did not change the fixed-seed output"
    await vllm.sleep()
    await vllm.wake()
    again = await vllm.sample(SampleRequest(PROMPT, max_tokens=16, seed=3, model="step1"))
    assert again.completion_ids == tuned.completion_ids
    assert max(abs(a - b) for a, b in zip(again.logprobs, tuned.logprobs, strict=True)) < 1e-3
    await vllm.unload("step1")


async def test_sleep_lets_a_stream_finish_and_refuses_what_arrives_while_asleep(vllm: VLLMEngine) -> None:
    long = SampleRequest(PROMPT, max_tokens=512, seed=4)
    chunks = vllm.stream(long)
    first = await anext(chunks)
    sleeping = asyncio.create_task(vllm.sleep())
    rest = [chunk async for chunk in chunks]
    await sleeping
    assert rest[-1].finish_reason in ("stop", "length"), "the turn in flight finished: mode=wait, never abort"
    assert len(first.ids) + sum(len(c.ids) for c in rest) > 0
    started = time.monotonic()
    with pytest.raises(EngineUnavailable):
        await vllm.sample(SampleRequest(PROMPT, max_tokens=4, seed=5))
    with pytest.raises(EngineUnavailable):
        await anext(vllm.stream(SampleRequest(PROMPT, max_tokens=4, seed=5)))
    assert time.monotonic() - started < 10, "refused at once, not queued until the wake"
    await vllm.wake()
    assert (await vllm.sample(SampleRequest(PROMPT, max_tokens=4, seed=5))).finish_reason in (
        "stop",
        "length",
    )


async def test_a_stream_vllm_aborts_is_unavailable_never_a_finished_turn(vllm: VLLMEngine) -> None:
    chunks = vllm.stream(SampleRequest(PROMPT, max_tokens=1500, seed=6))
    await anext(chunks)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{vllm.base_url}/sleep", params={"level": "1", "mode": "abort"}) as answer,
    ):
        assert answer.status == 200
    with pytest.raises(EngineUnavailable, match="aborted"):
        async for _ in chunks:
            pass
    await vllm.wake()
