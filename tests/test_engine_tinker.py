"""The Tinker engine: the real `tinker` SDK's SamplingClient against a FAKE Tinker service (its wire protocol,
sampling with the local engine and a tiny model), and against the real service when TINKER_API_KEY is set."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from rollout.engines.local import LocalEngine
from rollout.engines.protocol import CheckpointRef, EngineError, EngineUnavailable, SampleRequest
from rollout.engines.tinker import TinkerEngine
from rollout.engines.vllm_client import VLLMEngine
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Kind, Ledger
from rollout.ledger.streams import seat_stream
from rollout.net import free_port, serving
from rollout.rendering import ModelRenderer
from rollout.serving.keys import load_engine_api_key
from rollout.stack.processes import wait_for_http
from rollout_testing.tinker_service import FakeTinkerState, build_app, register_sampler, sampler_path
from tests.gatewayutil import serve_gateway

BASE_MODEL = "Qwen/Qwen3-8B"
KEY = "tml-fake-key"


@pytest.fixture(scope="module")
def backing(tiny_qwen3: str) -> LocalEngine:
    return LocalEngine(tiny_qwen3, device="cpu", batch_window_s=0.02)


@pytest.fixture
async def fake(backing: LocalEngine) -> AsyncIterator[tuple[str, FakeTinkerState]]:
    state = FakeTinkerState(api_key=KEY, base_model=BASE_MODEL, engine=backing)
    async with serving(build_app(state)) as url:
        yield url, state
    assert state.unknown_routes == [], "the SDK called routes the fake does not know"


@pytest.fixture
async def tinker(fake: tuple[str, FakeTinkerState]) -> AsyncIterator[TinkerEngine]:
    engine = TinkerEngine(BASE_MODEL, base_url=fake[0], api_key=KEY)
    yield engine
    await engine.close()


def chat_prompt(backing: LocalEngine, text: str) -> tuple[int, ...]:
    rendered = backing.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return tuple(rendered["input_ids"])


def greedy_reference(
    backing: LocalEngine, prompt_ids: tuple[int, ...], steps: int
) -> tuple[list[int], list[float]]:
    """Greedy ids and their logprobs from a plain forward pass, outside every engine."""
    import torch

    ids, logprobs = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(steps):
            logits = backing.model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return ids[len(prompt_ids) :], logprobs


async def test_samples_through_tinker_are_exact_ids_with_behaviour_logprobs(
    tinker: TinkerEngine, backing: LocalEngine, fake: tuple[str, FakeTinkerState]
) -> None:
    prompt = chat_prompt(backing, "count to three")
    greedy = await tinker.sample(SampleRequest(prompt, max_tokens=5, temperature=0.0, stop_token_ids=(0,)))
    ids, logprobs = greedy_reference(backing, prompt, 5)
    assert list(greedy.completion_ids) == ids and greedy.finish_reason == "length"
    assert greedy.logprobs == pytest.approx(logprobs, abs=1e-4)

    seeded = [SampleRequest(prompt, max_tokens=6, seed=seed) for seed in (1, 1, 2)]
    first, again, other = await asyncio.gather(*(tinker.sample(r) for r in seeded))
    assert first.completion_ids == again.completion_ids, "a seed fixes the sample"
    assert first.completion_ids != other.completion_ids
    assert all(math.isfinite(x) and x <= 0 for x in first.logprobs)
    assert fake[1].samples_served == 4


async def test_a_sampler_path_serves_its_checkpoint_by_name(
    tinker: TinkerEngine, backing: LocalEngine, fake: tuple[str, FakeTinkerState], tmp_path: Path
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapted = get_peft_model(
        AutoModelForCausalLM.from_pretrained(backing.model_path),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    adapted.save_pretrained(str(tmp_path / "step-1"))
    path = sampler_path("run-a", "step-1")
    await register_sampler(fake[1], path, CheckpointRef("step-1", str(tmp_path / "step-1")))

    await tinker.load(CheckpointRef("ckpt-1", path))
    assert tinker.models == ["base", "ckpt-1"]
    prompt = chat_prompt(backing, "hi")
    on_base = await tinker.sample(SampleRequest(prompt, max_tokens=4, temperature=0.0))
    on_checkpoint = await tinker.sample(SampleRequest(prompt, max_tokens=4, temperature=0.0, model="ckpt-1"))
    assert on_checkpoint.model == "ckpt-1" and on_checkpoint.logprobs != on_base.logprobs

    with pytest.raises(EngineError, match="no sampler weights"):
        await tinker.load(CheckpointRef("ckpt-2", sampler_path("run-a", "step-2")))
    with pytest.raises(ValueError, match="tinker://"):
        await tinker.load(CheckpointRef("ckpt-3", str(tmp_path / "step-1")))
    with pytest.raises(KeyError):
        await tinker.sample(SampleRequest(prompt, max_tokens=2, model="ckpt-9"))


async def test_refusals_and_outages_map_onto_the_engine_protocol(
    fake: tuple[str, FakeTinkerState], backing: LocalEngine
) -> None:
    request = SampleRequest(chat_prompt(backing, "hi"), max_tokens=2)
    wrong_key = TinkerEngine(BASE_MODEL, base_url=fake[0], api_key="tml-wrong")
    with pytest.raises(EngineError, match="401"):
        await wrong_key.sample(request)
    wrong_model = TinkerEngine("Qwen/Qwen3-0.6B", base_url=fake[0], api_key=KEY)
    with pytest.raises(EngineError, match="not served here"):
        await wrong_model.sample(request)
    await (
        wrong_model.close()
    )  # its session opened: finish it, or the SDK heartbeats it after the fake is gone
    down = TinkerEngine(
        BASE_MODEL, base_url=f"http://127.0.0.1:{free_port()}", api_key=KEY, connect_timeout_s=2
    )
    with pytest.raises(EngineUnavailable, match="within 2 s"):
        await down.sample(request)

    asleep = TinkerEngine(BASE_MODEL, base_url=fake[0], api_key=KEY)
    await asleep.sleep()
    assert not await asleep.health()
    with pytest.raises(EngineUnavailable, match="asleep"):
        await asleep.sample(request)
    await asleep.wake()
    assert len((await asleep.sample(request)).completion_ids) == 2
    await asleep.close()


async def test_the_gateway_records_turns_sampled_on_tinker(
    tinker: TinkerEngine, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    renderer = ModelRenderer(AutoTokenizer.from_pretrained(tiny_qwen3), "qwen3")
    seat_id = f"tinker-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent="solver")
    async with serve_gateway(ledger, renderer, tinker) as running:
        client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
        reply = await client.chat.completions.create(
            model="base", messages=[{"role": "user", "content": "hi"}], max_tokens=6
        )
    assert reply.usage is not None and reply.usage.completion_tokens == 6
    records = [
        dict(e.payload) for e in await ledger.read(seat_stream(seat_id)) if e.kind == Kind.TURN_RECORDED
    ]
    assert len(records) == 1 and records[0]["engine"] == "tinker"
    assert len(records[0]["completion_ids"]) == len(records[0]["completion_logprobs"]) == 6


@pytest.mark.slow
async def test_engine_serve_kind_tinker_speaks_vllms_dialect(
    fake: tuple[str, FakeTinkerState], models_dir: Path, tiny_qwen3: str, tmp_path: Path
) -> None:
    rollout = str(Path(sys.executable).parent / "rollout")
    port = free_port()
    argv = [
        rollout,
        "engine",
        "serve",
        "--kind",
        "tinker",
        "--model",
        "tiny-qwen3",
        "--tinker-base-model",
        BASE_MODEL,
        "--tinker-url",
        fake[0],
        "--port",
        str(port),
        f"models_dir={models_dir}",
        f"data_dir={tmp_path}",
    ]
    no_key = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=120, env=_without_tinker_key()
    )
    assert no_key.returncode != 0 and "TINKER_API_KEY" in no_key.stderr

    server = await asyncio.to_thread(
        subprocess.Popen, argv, env={**_without_tinker_key(), "TINKER_API_KEY": KEY}
    )
    client = VLLMEngine(f"http://127.0.0.1:{port}", api_key=load_engine_api_key(tmp_path), name="tinker")
    try:
        await asyncio.to_thread(wait_for_http, f"http://127.0.0.1:{port}/health", server)
        sampled = await client.sample(SampleRequest((1, 2, 3), max_tokens=3, temperature=0.0))
        assert len(sampled.completion_ids) == len(sampled.logprobs) == 3
        with pytest.raises(EngineError, match="no sampler weights"):
            await client.load(CheckpointRef("ckpt-1", sampler_path("run-a", "missing")))
    finally:
        await client.close()
        server.terminate()
        await asyncio.to_thread(server.wait, 30)


def _without_tinker_key() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TINKER_API_KEY"}


@pytest.mark.tinker_live
@pytest.mark.skipif(not os.environ.get("TINKER_API_KEY"), reason="needs TINKER_API_KEY (Tinker's hosted API)")
async def test_live_tinker_samples_with_logprobs() -> None:
    base_model = os.environ.get("ROLLOUT_TINKER_LIVE_MODEL", "Qwen/Qwen3-4B-Instruct-2507")
    engine = TinkerEngine(base_model)
    tokenizer: Any = AutoTokenizer.from_pretrained(base_model)
    prompt = tuple(
        tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True)
    )
    result = await engine.sample(SampleRequest(prompt, max_tokens=8, temperature=0.7))
    assert 0 < len(result.completion_ids) == len(result.logprobs) <= 8
    await engine.close()
