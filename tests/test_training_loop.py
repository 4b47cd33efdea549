"""The training loop end to end in one process: real Temporal, Postgres, HTTP, a real (tiny) model that
samples and trains, the gateway routing by serving acks, a follower loading each checkpoint into the
engine."""

from __future__ import annotations

import asyncio
import math
import secrets
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from transformers import AutoTokenizer

from rollout.activities.bridges import BridgeActivities
from rollout.activities.local_training import LocalProvider
from rollout.activities.training import TrainingActivities
from rollout.blobs import FileBlobStore
from rollout.config import Settings
from rollout.engines.follower import FollowerConfig, ServingFollower
from rollout.engines.local import LocalEngine
from rollout.engines.vllm_client import VLLMEngine
from rollout.engines.vllm_server import build_app as build_engine_app
from rollout.gateway.admission import Admission
from rollout.gateway.app import build_app
from rollout.gateway.routing import EngineSlot, Routes
from rollout.gateway.service import Gateway
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import find_run, run_turns
from rollout.ledger.streams import SERVING_ACKS, SERVING_TARGETS, policy_checkpoints_stream, run_stream
from rollout.net import serving
from rollout.rendering import ModelRenderer
from rollout.rl.losses import PPO, LossConfig
from rollout.run.settings import MaxLagChange, RunSettings, RunStatus
from rollout.serving.keys import engine_api_key
from rollout.training.local import LocalTrainerConfig
from rollout.workers.runner import runner_worker
from rollout.workers.trainer import trainer_worker
from rollout.workflows.names import run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout.workflows.training_types import TrainingSpec
from tests.sandboxutil import SANDBOX_KEY


@dataclass
class Loop:
    client: Client
    run: str
    queue: str
    trainer_queue: str
    engine: LocalEngine
    follower: ServingFollower


@asynccontextmanager
async def training_loop(
    settings: Settings,
    ledger: Ledger,
    model: str,
    scratch: Path,
    *,
    learning_rate: float = 1e-3,
    follow_all: bool = False,
    max_context: int = 2048,
    gpu: str | None = None,
    lora_rank: int = 4,
    external_api_bases: Sequence[str] = (),
) -> AsyncIterator[Loop]:
    """Engine + follower, gateway, runner worker and trainer worker, all serving one run (`follow_all`: the
    follower loads every run's checkpoints, a warm start's too; blobs under `scratch / "blobs"`; `gpu`:
    one-GPU mode, the engine sleeping while the trainer holds that GPU's lease; `lora_rank=0`: full
    weights)."""
    run = f"train-{uuid.uuid4().hex[:6]}"
    client = await Client.connect(settings.temporal_address)
    queue, trainer_queue = f"runner-{uuid.uuid4().hex[:8]}", f"trainer-{uuid.uuid4().hex[:8]}"
    store = FileBlobStore(scratch / "blobs")
    engine = LocalEngine(model, device="cpu")
    api_key = engine_api_key(secrets.token_bytes(32))  # the gateway's engine client holds the engine's key
    async with serving(build_engine_app(engine, api_key=api_key)) as engine_url:
        follower = ServingFollower(
            ledger,
            engine,
            store,
            FollowerConfig(
                "engine-a",
                engine_url,
                formats=("lora", "full"),
                runs=() if follow_all else (run,),
                poll_s=0.1,
                grace_s=2.0,
                gpu=gpu,
            ),
            scratch / "engine-cache",
        )
        following = asyncio.create_task(follower.run())
        renderer = ModelRenderer(AutoTokenizer.from_pretrained(model), "qwen3")
        engine_client = VLLMEngine(engine_url, api_key=api_key, name="engine-a")
        routes = Routes(ledger, [EngineSlot(engine_client)], refresh_s=0.1)
        gateway = Gateway(
            ledger,
            renderer,
            Admission(ledger, routes, wait_s=60, poll_s=0.05),
            max_context=max_context,
            external_api_bases=external_api_bases,
        )
        provider = LocalProvider(
            ledger,
            store,
            model_path=model,
            holder="trainer-1",
            scratch=scratch / "trainer",
            config=LocalTrainerConfig(lora_rank=lora_rank or None, learning_rate=learning_rate, device="cpu"),
            loss=LossConfig(PPO()),
            gpu_lease=gpu,
            resolve=lambda spec: spec,  # a policy's own model here is a local folder, as given
        )
        training = TrainingActivities(ledger, store, provider, holder="trainer-1")
        bridges = BridgeActivities(ledger, store, base_model=model, scratch=scratch)
        try:
            async with serving(build_app(gateway, model_names=["base"])) as gateway_url:
                runner = runner_worker(
                    client,
                    ledger,
                    gateway_url=gateway_url,
                    seat_secret=b"s" * 32,
                    sandbox_key=SANDBOX_KEY,
                    task_queue=queue,
                    tracking_dir=scratch / "tracking",
                )
                async with runner, trainer_worker(client, training, bridges, task_queue=trainer_queue):
                    yield Loop(client, run, queue, trainer_queue, engine, follower)
        finally:
            following.cancel()
            await engine_client.close()


def run_input(
    loop: Loop,
    steps: int,
    *,
    max_lag: int = 1,
    serve_formats: tuple[str, ...] = ("lora",),
    served_wait_s: float = 60,
) -> RunInput:
    return RunInput(
        loop.run,
        "tests.example_envs:coin",
        groups_in_flight=2,
        settings=RunSettings(max_lag=max_lag, max_tokens=4),
        training=TrainingSpec(
            steps,
            groups_per_batch=1,
            wait_s=0.2,
            served_wait_s=served_wait_s,
            task_queue=loop.trainer_queue,
            serve_formats=list(serve_formats),
        ),
    )


async def turns_of_run(ledger: Ledger, run: str) -> list[dict[str, Any]]:
    return [{**e.payload, "recorded_at": e.recorded_at} for e in await run_turns(ledger, run)]


async def test_a_run_trains_a_chain_of_checkpoints_and_serves_each_while_episodes_play(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path) as loop:
        status: RunStatus = await asyncio.wait_for(
            loop.client.execute_workflow(
                RunWorkflow.run, run_input(loop, 3), id=run_workflow_id(loop.run), task_queue=loop.queue
            ),
            300,
        )
        policy = run_policy(loop.run, "default")
        created = [
            e.payload
            for e in await ledger.read(policy_checkpoints_stream(policy))
            if e.kind == Kind.CHECKPOINT_CREATED
        ]
        assert [(c["version"], c["parent"]) for c in created] == [
            (1, None),
            (2, f"{policy}-step000001"),
            (3, f"{policy}-step000002"),
        ]
        assert status.trained == {"default": f"{policy}-step000003"}
        assert all(math.isfinite(c["metrics"]["loss"]) and c["metrics"]["tokens"] > 0 for c in created)
        assert all("staleness_mean" in c["metrics"] for c in created)

        targets = [
            e.payload
            for e in await ledger.read(SERVING_TARGETS, limit=100000)
            if e.payload["run"] == loop.run
        ]
        assert [(t["version"], t["format"]) for t in targets] == [(1, "lora"), (2, "lora"), (3, "lora")]
        acks = [
            e.payload
            for e in await ledger.read(SERVING_ACKS, limit=100000)
            if e.payload["engine"] == "engine-a"
        ]
        # Other tests' loops name their engine alike: this run's checkpoints are its policy's.
        served = {s["checkpoint"] for ack in acks for s in ack["serving"] if s["policy"] == policy}
        assert served == {c["name"] for c in created}, "every checkpoint was served"
        assert loop.engine.models[0] == "base" and f"{policy}-step000003" in loop.engine.models

        turns = await turns_of_run(ledger, loop.run)
        assert {t["checkpoint"] for t in turns} >= {"base", f"{policy}-step000001"}, (
            "checkpoints served mid-run"
        )
        # Staleness: no turn began on a checkpoint more than max_lag=1 behind the newest one at that moment.
        for turn in turns:
            assert turn["checkpoint_version"] >= turn["admitted_newest"] - 1
            newest_before = max(
                (
                    c["version"]
                    for c, e in zip(created, await _created_events(ledger, policy), strict=True)
                    if e < turn["recorded_at"]
                ),
                default=0,
            )
            # A checkpoint created while the turn was sampling may be newer by one more.
            assert turn["checkpoint_version"] >= newest_before - 2


async def _created_events(ledger: Ledger, policy: str) -> list[Any]:
    return [
        e.recorded_at
        for e in await ledger.read(policy_checkpoints_stream(policy))
        if e.kind == Kind.CHECKPOINT_CREATED
    ]


@pytest.mark.parametrize("learning_rate", [1e30])
async def test_a_non_finite_loss_publishes_nothing_and_pauses_the_run_with_the_reason(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path, learning_rate: float
) -> None:
    async with training_loop(
        stack_settings, ledger, tiny_qwen3, tmp_path, learning_rate=learning_rate
    ) as loop:
        # The run waits for its last checkpoint to be served before it reports the pause; step 1's, trained at
        # a learning rate of 1e30, may never be: that wait is cut to 5 s.
        handle = await loop.client.start_workflow(
            RunWorkflow.run,
            run_input(loop, 3, served_wait_s=5),
            id=run_workflow_id(loop.run),
            task_queue=loop.queue,
        )
        status: RunStatus | None = None
        for _ in range(600):
            status = await handle.query(RunWorkflow.status)
            if status.paused:
                break
            await asyncio.sleep(0.2)
        assert status is not None and status.paused, "the run paused"
        assert status.pause_reason is not None and "not published" in status.pause_reason
        assert "finite" in status.pause_reason
        policy = run_policy(loop.run, "default")
        versions = [
            e.payload["version"]
            for e in await ledger.read(policy_checkpoints_stream(policy))
            if e.kind == Kind.CHECKPOINT_CREATED
        ]
        bad_step = int(status.pause_reason.split()[1])
        assert bad_step not in versions, "the step with the non-finite loss published nothing"
        row = await find_run(ledger, loop.run)
        assert row is not None and row.settings.paused and "finite" in (row.settings.pause_reason or "")
        await handle.terminate("test over")


async def _wait_for_version(ledger: Ledger, policy: str, version: int, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.2)):
        if version in [
            e.payload["version"]
            for e in await ledger.read(policy_checkpoints_stream(policy))
            if e.kind == Kind.CHECKPOINT_CREATED
        ]:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"checkpoint {version} of {policy} was not created in {timeout_s} s")


async def test_max_lag_zero_trains_synchronously_and_a_change_mid_run_bounds_the_next_turns(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path) as loop:
        handle = await loop.client.start_workflow(
            RunWorkflow.run,
            run_input(loop, 4, max_lag=0),
            id=run_workflow_id(loop.run),
            task_queue=loop.queue,
        )
        policy = run_policy(loop.run, "default")
        await _wait_for_version(ledger, policy, 2, 240)
        changed = await handle.execute_update(RunWorkflow.set_max_lag, MaxLagChange(2))
        assert changed.max_lag == 2
        status: RunStatus = await asyncio.wait_for(handle.result(), 300)
        assert status.trained == {"default": f"{policy}-step000004"}

        created_at = dict(
            zip(
                [
                    e.payload["version"]
                    for e in await ledger.read(policy_checkpoints_stream(policy))
                    if e.kind == Kind.CHECKPOINT_CREATED
                ],
                await _created_events(ledger, policy),
                strict=True,
            )
        )
        (change,) = [
            e
            for e in await ledger.read(run_stream(loop.run))
            if e.kind == Kind.SETTINGS_CHANGED and "max_lag" in e.payload["changes"]
        ]
        assert change.payload["changes"]["max_lag"] == 2
        turns = await turns_of_run(ledger, loop.run)
        before = [t for t in turns if t["admitted_max_lag"] == 0]
        after = [t for t in turns if t["admitted_max_lag"] == 2]
        assert before and after and len(before) + len(after) == len(turns)
        assert all(t["recorded_at"] > change.recorded_at for t in after), (
            "the new bound applies after the change"
        )
        # max_lag 0: every turn sampled on the newest checkpoint; every turn of the new bound within 2 of it.
        assert all(t["checkpoint_version"] == t["admitted_newest"] for t in before)
        assert all(t["checkpoint_version"] >= t["admitted_newest"] - 2 for t in after)
        # Synchronous: with one group per batch, group g (g >= 1) starts only once step g's checkpoint exists.
        first_turn: dict[int, Any] = {}
        for turn in before:
            group = int(turn["episode"][1:7])
            first_turn.setdefault(group, turn["recorded_at"])
        assert len(first_turn) >= 2
        for group, started_at in first_turn.items():
            if group >= 1:
                assert started_at > created_at[group], (
                    f"group {group} began before checkpoint {group} existed"
                )
