"""The `tinker` training provider: the real `tinker` SDK against a FAKE Tinker service (its wire protocol; the
fake trains a tiny model with torch + peft), and against the real service when TINKER_API_KEY is set."""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from temporalio.client import Client
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout.activities.bridges import BridgeActivities
from rollout.activities.tinker_training import (
    TinkerProvider,
    TinkerTrainerConfig,
    diagnostics,
    to_tinker_datum,
)
from rollout.activities.training import TrainingActivities
from rollout.blobs import FileBlobStore
from rollout.config import Settings
from rollout.engines.follower import FollowerConfig, ServingFollower
from rollout.engines.local import LocalEngine
from rollout.engines.protocol import SampleRequest
from rollout.engines.tinker import TinkerEngine
from rollout.engines.vllm_client import VLLMEngine
from rollout.engines.vllm_server import build_app as build_engine_app
from rollout.gateway.admission import Admission
from rollout.gateway.app import build_app as build_gateway_app
from rollout.gateway.routing import EngineSlot, Routes
from rollout.gateway.service import Gateway
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import run_turns
from rollout.ledger.streams import SERVING_ACKS, SERVING_TARGETS, policy_checkpoints_stream
from rollout.net import serving
from rollout.rendering import ModelRenderer
from rollout.rl.batches import Batch, WeightedSegment
from rollout.rl.losses import PPO, LossConfig, TruncatedIS
from rollout.rl.segments import TrainingSegment
from rollout.run.settings import RunSettings, RunStatus
from rollout.serving.keys import engine_api_key
from rollout.training.tinker_data import loss_function, tinker_datums
from rollout.workers.runner import runner_worker
from rollout.workers.trainer import trainer_worker
from rollout.workflows.names import run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout.workflows.training_types import TrainingSpec
from rollout_testing.tinker_service import FakeTinkerState, build_app
from rollout_testing.tinker_training import FakeTinkerTraining

BASE_MODEL = "Qwen/Qwen3-8B"
KEY = "tml-fake-key"


def _batch(*segments: tuple[list[int], list[int], list[float], float]) -> Batch:
    weighted = tuple(
        WeightedSegment(
            episode=f"e{i}",
            agent="solver",
            advantage=advantage,
            segment=TrainingSegment(
                segment_id=f"s{i}",
                seat="seat",
                tokens_T=tuple(tokens),
                mask_T=tuple(mask),
                behaviour_logprobs_T=tuple(logprobs),
                versions_T=(0,) * len(tokens),
            ),
        )
        for i, (tokens, mask, logprobs, advantage) in enumerate(segments)
    )
    sampled = sum(sum(mask) for _, mask, _, _ in segments)
    return Batch(
        policy="p",
        segments=weighted,
        episodes=tuple(w.episode for w in weighted),
        skipped_groups=0,
        reward_mean=0.5,
        reward_std=0.5,
        sampled_tokens=sampled,
    )


def test_a_segment_becomes_a_datum_shifted_by_one_with_loss_on_sampled_tokens_only() -> None:
    batch = _batch(
        ([10, 11, 12, 13, 14], [0, 0, 1, 1, 0], [0.0, 0.0, -0.5, -0.7, 0.0], 2.0),
        ([20, 21, 22], [0, 1, 1], [0.0, -0.1, -0.2], -1.0),
        ([30, 31], [0, 0], [0.0, 0.0], 1.0),
    )
    first, second = tinker_datums(batch)  # the third has nothing sampled: no datum
    assert first.model_input_T == (10, 11, 12, 13) and first.target_tokens_T == (11, 12, 13, 14)
    assert first.mask_T == (0, 1, 1, 0)
    assert first.logprobs_T == (0.0, -0.5, -0.7, 0.0)
    # Tinker sums over tokens: each advantage is divided by the batch's 4 sampled tokens, so the sum is a
    # mean.
    assert first.advantages_T == (0.0, 0.5, 0.5, 0.0)
    assert second.advantages_T == (-0.25, -0.25)
    assert loss_function(LossConfig(PPO(clip_low=0.2, clip_high=0.28))) == (
        "ppo",
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28},
    )
    assert loss_function(LossConfig(TruncatedIS())) == ("importance_sampling", {})


@asynccontextmanager
async def fake_tinker(tiny_qwen3: str, tmp_path: Path) -> AsyncIterator[tuple[str, FakeTinkerState]]:
    backing = LocalEngine(tiny_qwen3, device="cpu", batch_window_s=0.01)
    state = FakeTinkerState(
        api_key=KEY,
        base_model=BASE_MODEL,
        engine=backing,
        training=FakeTinkerTraining(tiny_qwen3, tmp_path / "fake-tinker"),
    )
    async with serving(build_app(state)) as url:
        yield url, state
    assert state.unknown_routes == [], "the SDK called routes the fake does not know"


def _reference_logprobs(tiny_qwen3: str, tokens: list[int]) -> list[float]:
    """The base model's logprob of each next token (a new LoRA adapter starts as the base model)."""
    model: Any = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1).tolist()


async def test_the_sdk_trains_saves_resumes_and_samples_through_the_fake(
    tiny_qwen3: str, tmp_path: Path
) -> None:
    import tinker

    tokens = [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198, 19, 151645]
    sampling = [-1.0] * (len(tokens) - 1)
    advantages = [0.0] * 9 + [0.5, -0.25, 0.0, 0.5]
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData(data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]),
            "logprobs": tinker.TensorData(data=sampling, dtype="float32", shape=[len(sampling)]),
            "advantages": tinker.TensorData(data=advantages, dtype="float32", shape=[len(advantages)]),
        },
    )
    reference = _reference_logprobs(tiny_qwen3, tokens)
    async with fake_tinker(tiny_qwen3, tmp_path) as (url, state):
        service = await asyncio.to_thread(tinker.ServiceClient, base_url=url, api_key=KEY)
        # The SDK's first call opens its session and blocks until the fake (on this loop) answers: a thread.
        client = await asyncio.to_thread(
            lambda: service.create_lora_training_client(BASE_MODEL, rank=4).result()
        )
        output = await client.forward_backward([datum], "importance_sampling").result_async()
        logprobs = output.loss_fn_outputs[0]["logprobs"].tolist()
        assert logprobs == pytest.approx(reference, abs=1e-4), "logprobs of the targets, before the update"
        expected = -sum(math.exp(lp + 1.0) * a for lp, a in zip(reference, advantages, strict=True))
        assert output.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)
        await client.optim_step(tinker.AdamParams(learning_rate=1e-2)).result_async()
        state_path = (await client.save_state("after-one").result_async()).path
        sampler_path = (await client.save_weights_for_sampler("after-one").result_async()).path
        moved = (
            (await client.forward_backward([datum], "ppo").result_async())
            .loss_fn_outputs[0]["logprobs"]
            .tolist()
        )
        assert moved != pytest.approx(logprobs, abs=1e-4), "the optimiser step changed the weights"
        assert state.training is not None and state.training.losses_seen == ["importance_sampling", "ppo"]

        resumed = await asyncio.to_thread(
            lambda: service.create_training_client_from_state_with_optimizer(state_path).result()
        )
        again = (
            (await resumed.forward_backward([datum], "ppo").result_async())
            .loss_fn_outputs[0]["logprobs"]
            .tolist()
        )
        assert again == pytest.approx(moved, abs=1e-5), "the saved state resumes the same weights"

        engine = TinkerEngine(BASE_MODEL, base_url=url, api_key=KEY)
        try:
            from rollout.engines.protocol import CheckpointRef

            await engine.load(CheckpointRef("after-one", sampler_path))
            sampled = await engine.sample(
                SampleRequest(tuple(tokens[:11]), max_tokens=3, model="after-one", seed=1)
            )
            assert len(sampled.completion_ids) == len(sampled.logprobs) > 0
        finally:
            await engine.close()


def test_diagnostics_report_ratios_against_each_tokens_sampler() -> None:
    batch = _batch(([1, 2, 3], [0, 1, 1], [0.0, math.log(0.5), math.log(0.25)], 1.0))
    datums = tinker_datums(batch)
    current = [[math.log(0.5), math.log(0.5)]]  # the second sampled token is twice as likely now
    metrics = diagnostics(datums, current, LossConfig(PPO()))
    assert metrics["ratio_mean"] == pytest.approx(1.5) and metrics["ratio_max"] == pytest.approx(2.0)


async def test_a_run_trains_through_tinker_and_its_engines_sample_each_checkpoint(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    run = f"tinker-{uuid.uuid4().hex[:6]}"
    client = await Client.connect(stack_settings.temporal_address)
    queue, trainer_queue = f"runner-{uuid.uuid4().hex[:8]}", f"trainer-{uuid.uuid4().hex[:8]}"
    store = FileBlobStore(tmp_path / "blobs")
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    async with fake_tinker(tiny_qwen3, tmp_path) as (url, state):
        engine = TinkerEngine(BASE_MODEL, base_url=url, api_key=KEY, tokenizer=tokenizer)
        api_key = engine_api_key(secrets.token_bytes(32))
        async with serving(build_engine_app(engine, api_key=api_key)) as engine_url:
            follower = ServingFollower(
                ledger,
                engine,
                store,
                FollowerConfig(
                    "engine-tinker", engine_url, formats=("tinker",), runs=(run,), poll_s=0.1, grace_s=2.0
                ),
                tmp_path / "cache",
            )
            following = asyncio.create_task(follower.run())
            engine_client = VLLMEngine(engine_url, api_key=api_key, name="engine-tinker")
            routes = Routes(ledger, [EngineSlot(engine_client)], refresh_s=0.1)
            gateway = Gateway(
                ledger,
                ModelRenderer(tokenizer, "qwen3"),
                Admission(ledger, routes, wait_s=60, poll_s=0.05),
                max_context=2048,
            )
            tinker = TinkerProvider(
                ledger,
                store,
                config=TinkerTrainerConfig(
                    BASE_MODEL, lora_rank=4, learning_rate=1e-3, base_url=url, api_key=KEY
                ),
                loss=LossConfig(PPO()),
                scratch=tmp_path / "trainer",
            )
            training = TrainingActivities(ledger, store, tinker, holder="tinker-trainer")
            bridges = BridgeActivities(ledger, store, base_model=None, scratch=tmp_path)
            given = RunInput(
                run,
                "tests.example_envs:coin",
                groups_in_flight=2,
                settings=RunSettings(max_lag=1, max_tokens=4),
                training=TrainingSpec(
                    2,
                    groups_per_batch=1,
                    wait_s=0.2,
                    served_wait_s=60,
                    serve_formats=["tinker"],
                    task_queue=trainer_queue,
                ),
            )
            try:
                async with serving(build_gateway_app(gateway, model_names=["base"])) as gateway_url:
                    runner = runner_worker(
                        client,
                        ledger,
                        gateway_url=gateway_url,
                        seat_secret=b"s" * 32,
                        sandbox_key=b"k" * 32,
                        task_queue=queue,
                    )
                    async with runner, trainer_worker(client, training, bridges, task_queue=trainer_queue):
                        status: RunStatus = await asyncio.wait_for(
                            client.execute_workflow(
                                RunWorkflow.run, given, id=run_workflow_id(run), task_queue=queue
                            ),
                            300,
                        )
            finally:
                following.cancel()
                await engine_client.close()
                await engine.close()
        assert state.training is not None and set(state.training.losses_seen) == {"ppo"}

    policy = run_policy(run, "default")
    created = [
        e.payload
        for e in await ledger.read(policy_checkpoints_stream(policy))
        if e.kind == Kind.CHECKPOINT_CREATED
    ]
    assert [(c["version"], c["parent"]) for c in created] == [(1, None), (2, f"{policy}-step000001")]
    assert status.trained == {"default": f"{policy}-step000002"}
    assert all(set(c["files"]) == {"tinker.json"} and math.isfinite(c["metrics"]["loss"]) for c in created)
    assert all("kl_k3" in c["metrics"] and "staleness_mean" in c["metrics"] for c in created)
    targets = [e.payload for e in await ledger.read(SERVING_TARGETS, limit=100000) if e.payload["run"] == run]
    assert [(t["version"], t["format"]) for t in targets] == [(1, "tinker"), (2, "tinker")]
    assert all(
        str(t["location"]).startswith("tinker://") and "/sampler_weights/" in t["location"] for t in targets
    )
    acks = [
        e.payload
        for e in await ledger.read(SERVING_ACKS, limit=100000)
        if e.payload["engine"] == "engine-tinker"
    ]
    assert {s["checkpoint"] for ack in acks for s in ack["serving"]} == {c["name"] for c in created}
    turns = await run_turns(ledger, run)
    assert f"{policy}-step000001" in {t.payload["checkpoint"] for t in turns}, "a turn sampled checkpoint 1"


@pytest.mark.tinker_live
@pytest.mark.skipif(not os.environ.get("TINKER_API_KEY"), reason="needs TINKER_API_KEY (Tinker's hosted API)")
async def test_live_tinker_trains_one_step_from_a_datum() -> None:
    import tinker

    service = await asyncio.to_thread(tinker.ServiceClient)
    client = await asyncio.to_thread(
        lambda: service.create_lora_training_client("Qwen/Qwen3-4B-Instruct-2507", rank=8).result()
    )
    batch = _batch(
        (
            [151644, 872, 198, 17, 151645, 198, 17, 151645],
            [0, 0, 0, 0, 0, 0, 1, 1],
            [0.0] * 6 + [-1.0, -1.0],
            1.0,
        )
    )
    datums = tinker_datums(batch)
    output = await client.forward_backward(
        [to_tinker_datum(d) for d in datums], "importance_sampling"
    ).result_async()
    assert math.isfinite(output.metrics["loss:sum"])
    await client.optim_step(tinker.AdamParams(learning_rate=1e-5)).result_async()
