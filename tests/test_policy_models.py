"""A base model per policy, piece by piece (the whole of it trains in tests/test_cli_on_one_stack.py): the
`policies.NAME.*` settings, what is refused before a run starts, the run's recorded models, routing and
rendering by a seat's model, and engines loading only their own model's checkpoints."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path

import pytest

from rollout.blobs import open_store
from rollout.config import ConfigError, Settings, load
from rollout.config.overrides import overrides_for
from rollout.contracts import Message
from rollout.control.errors import ControlError
from rollout.control.policy_models import (
    base_models,
    check_policy_models,
    models_said,
    own_models,
    policy_models,
)
from rollout.control.preflight import PreflightFailed, confirm_trainers_poll
from rollout.engines.follower import FollowerConfig, ServingFollower
from rollout.engines.protocol import CheckpointRef, EngineUnavailable
from rollout.engines.scripted import ScriptedEngine
from rollout.gateway.admission import Admission, RunSettings, eligible
from rollout.gateway.renderers import Renderers
from rollout.gateway.routing import EngineSlot, Routes
from rollout.gateway.seats import Seat
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import SERVING_ACKS, SERVING_TARGETS, policy_checkpoints_stream, run_stream
from rollout.records.serving import ServingAck, ServingTarget
from rollout.rendering import ModelRenderer
from rollout.run.launches import LAUNCH_SECTIONS, RunLaunch
from rollout.workflows.names import run_policy, run_workflow_id, training_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.training_types import PolicyModel
from signals.environment import environment as signals
from signals.environment import two_models
from tests.test_training_loop import run_input, training_loop


def test_policies_are_set_from_the_command_line_and_recorded_in_the_launch() -> None:
    settings = load(["policies.listener.model=tiny-qwen3", "policies.speaker.lora_rank=4"])
    assert settings.policies["listener"].model == "tiny-qwen3" and settings.policies["speaker"].lora_rank == 4
    launch = RunLaunch(run="r", environment="e:e", overrides=overrides_for(settings, *LAUNCH_SECTIONS))
    again = load(RunLaunch.from_payload(launch.to_payload()).overrides)
    assert again.policies == settings.policies, "a run brought back gets its policies' own settings"
    with pytest.raises(ConfigError, match=r"^unknown setting 'policies.listener.modell'. Valid keys under"):
        load(["policies.listener.modell=x"])
    with pytest.raises(ConfigError, match=r"^bad value for 'policies.listener.lora_rank'"):
        load(["policies.listener.lora_rank=many"])
    with pytest.raises(ConfigError, match=r"^bad setting 'policies.listener': write policies.NAME.KEY=VALUE"):
        load(["policies.listener=tiny-qwen3"])


def test_each_policy_has_its_model_and_the_run_records_them_when_there_are_several() -> None:
    quickstart = load(["preset=cpu-quickstart"])
    assert base_models(quickstart, signals) == ["smollm2"] and own_models(quickstart, signals) == {}
    assert policy_models(quickstart, signals) == {}, "one model: nothing recorded, nothing routed"
    assert models_said(quickstart, signals) == "smollm2"
    assert base_models(quickstart, two_models) == ["smollm2", "tiny-qwen3"]
    assert models_said(quickstart, two_models) == "speaker on tiny-qwen3, listener on smollm2"
    config_wins = load(["preset=cpu-quickstart", "policies.speaker.model=smollm2"])
    assert base_models(config_wins, two_models) == ["smollm2"], (
        "the config's policies.* over the environment's"
    )
    own_trainer = load(["preset=cpu-quickstart", "policies.listener.trainer_queue=rollout-trainer-smollm2"])
    assert own_models(own_trainer, signals) == {
        "listener": PolicyModel("smollm2", task_queue="rollout-trainer-smollm2")
    }, "a trainer of its own, on the run's model"


def test_bad_policy_settings_are_refused_in_one_line_before_a_run() -> None:
    refused = {
        "policies.teller.model=smollm2": "policies.teller: signals has no policy 'teller' (its policies: speaker",
        "policies.speaker.model=gpt-9": "policies.speaker.model=gpt-9 names no model rollout knows",
    }
    for override, said in refused.items():
        with pytest.raises(ControlError) as raised:
            check_policy_models(load([override]), signals)
        assert str(raised.value).startswith(said) and "\n" not in str(raised.value)
    tinker = load(["trainer.provider=tinker", "trainer.tinker_base_model=Qwen/Qwen3-8B"])
    with pytest.raises(ControlError, match="policies speaker set a model or trainer settings of their own"):
        check_policy_models(tinker, two_models)
    vllm = load(["services.engine.kind=vllm", "policies.speaker.lora_rank=128"])
    with pytest.raises(ControlError, match=r"policies.speaker.lora_rank=128 is above what vLLM loads"):
        check_policy_models(vllm, signals)
    check_policy_models(load(["policies.speaker.model=Qwen/Qwen3-0.6B"]), signals)  # an HF id is a model


def _seat(run: str, policy: str, checkpoint: str | None = None) -> Seat:
    return Seat(
        seat_id=f"{run}/{policy}",
        run=run,
        episode=None,
        agent=policy,
        policy=f"{run}/{policy}",
        checkpoint=checkpoint,
    )


def test_a_turn_goes_only_to_engines_of_its_policys_model(renderer: ModelRenderer) -> None:
    engine = ScriptedEngine(renderer, lambda _: Message.assistant("ok"))
    slots = [
        EngineSlot(engine, model="smollm2"),
        EngineSlot(engine, model="tiny-qwen3"),
        EngineSlot(engine, "r/speaker-step000001", 1, "r/speaker", model="tiny-qwen3"),
    ]
    settings = RunSettings(policy_models={"speaker": "tiny-qwen3", "listener": "smollm2"})
    speaker, listener = _seat("r", "speaker"), _seat("r", "listener")
    assert [s.version for s in eligible(slots, speaker, settings, 1, "tiny-qwen3")] == [1, 0]
    assert all(s.model == "tiny-qwen3" for s in eligible(slots, speaker, settings, 1, "tiny-qwen3"))
    assert [s.model for s in eligible(slots, listener, settings, 0, "smollm2")] == ["smollm2"]
    assert len(eligible(slots, listener, settings, 0)) == 2, "a run naming no model: any engine's base"


async def _ack(ledger: Ledger, key: bytes, url: str, model: str, serving: tuple[str, ...] = ()) -> None:
    from rollout.records.serving import Served

    ack = ServingAck(
        engine=f"engine-{uuid.uuid4().hex[:6]}",
        url=url,
        incarnation="i",
        n=1,
        model=model,
        serving=tuple(Served(c.rpartition("-")[0], c, 1) for c in serving),
    ).signed(key)
    await ledger.append_one(SERVING_ACKS, NewEvent(ack.key, Kind.SERVING_ACK, ack.to_payload()))


async def test_a_seat_renders_with_its_models_tokenizer_once_an_engine_serves_it(
    ledger: Ledger, renderer: ModelRenderer
) -> None:
    run, key = f"run-{uuid.uuid4().hex[:8]}", uuid.uuid4().bytes
    other = f"other-{run}"  # a model no other test's engine serves
    settings = RunSettings(policy_models={"speaker": other, "listener": "smollm2"}).recorded()
    await ledger.append_one(
        run_stream(run),
        NewEvent("created", Kind.RUN_CREATED, {"run": run, "environment": "e", "settings": settings}),
    )
    engine = ScriptedEngine(renderer, lambda _: Message.assistant("ok"))
    routes = Routes(ledger, [], connect=lambda url, name: engine, ack_key=key, model="smollm2", refresh_s=0)
    built: list[str] = []

    def build(model: str) -> ModelRenderer:
        built.append(model)
        return renderer

    own = object.__new__(ModelRenderer)  # the gateway's own model's: told apart by identity
    renderers = Renderers(Admission(ledger, routes), own, model="smollm2", build=build)
    assert await renderers.for_seat(_seat(run, "listener")) is own
    with pytest.raises(EngineUnavailable, match=f"no engine serves {other}"):
        await renderers.for_seat(_seat(run, "speaker"))
    assert built == [], "a model no believed engine serves is never loaded"
    await _ack(ledger, uuid.uuid4().bytes, "http://127.0.0.1:9", other)  # forged: not signed with the key
    with pytest.raises(EngineUnavailable):
        await renderers.for_seat(_seat(run, "speaker"))
    await _ack(ledger, key, f"http://127.0.0.1:1/{run}", other, (f"{run}/speaker-step000001",))
    assert await renderers.for_seat(_seat(run, "speaker")) is renderer
    assert await renderers.for_seat(_seat(run, "speaker")) is renderer and built == [other], "built once"
    pinned = _seat(f"eval-{run}", "speaker", checkpoint=f"{run}/speaker-step000001")
    assert await renderers.for_seat(pinned) is renderer, "an eval's seat: the model serving its checkpoint"


class RecordingEngine:
    def __init__(self) -> None:
        self.loaded: list[str] = []

    async def load(self, checkpoint: CheckpointRef) -> None:
        self.loaded.append(checkpoint.name)

    async def unload(self, name: str) -> None: ...
    async def sleep(self) -> None: ...
    async def wake(self) -> None: ...


async def test_an_engine_loads_only_its_own_models_checkpoints(ledger: Ledger, tmp_path: Path) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    for policy, model in (("speaker", "tiny-qwen3"), ("listener", "smollm2"), ("old", "")):
        target = ServingTarget(f"{run}/{policy}", f"{run}/{policy}-step000001", 1, run, "lora", model=model)
        await ledger.append_one(
            SERVING_TARGETS, NewEvent(target.key, Kind.SERVING_TARGET, target.to_payload())
        )
    engine = RecordingEngine()
    config = FollowerConfig(engine="e", url="http://127.0.0.1:1", model="smollm2", runs=(run,), poll_s=0.05)
    follower = ServingFollower(ledger, engine, open_store(tmp_path.as_uri()), config, tmp_path / "cache")
    await follower.step()
    assert sorted(engine.loaded) == [f"{run}/listener-step000001", f"{run}/old-step000001"]
    assert follower.state().model == "smollm2", "its acks say which model it serves"


async def test_a_policy_trains_on_the_trainer_polling_its_own_queue(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path) as loop:
        given = run_input(loop, 1)
        assert given.training is not None
        # No worker polls the run's trainer queue: the policy trains only if its own queue is used.
        nobody = f"nobody-{uuid.uuid4().hex[:6]}"
        own = {"default": PolicyModel(tiny_qwen3, task_queue=loop.trainer_queue)}
        with pytest.raises(PreflightFailed, match=rf"^policies.default.trainer_queue={nobody}: no trainer"):
            await confirm_trainers_poll(
                loop.client,
                dataclasses.replace(
                    given.training, models={"default": PolicyModel(tiny_qwen3, task_queue=nobody)}
                ),
                patience_s=1,
            )
        given.training = dataclasses.replace(given.training, task_queue=nobody, models=own)
        await confirm_trainers_poll(loop.client, given.training)
        await asyncio.wait_for(
            loop.client.execute_workflow(
                RunWorkflow.run, given, id=run_workflow_id(loop.run), task_queue=loop.queue
            ),
            300,
        )
        training = loop.client.get_workflow_handle(training_workflow_id(loop.run, "default"))
        assert (await training.describe()).task_queue == loop.trainer_queue
    created = [
        e
        for e in await ledger.read(policy_checkpoints_stream(run_policy(loop.run, "default")))
        if e.kind == Kind.CHECKPOINT_CREATED
    ]
    assert len(created) == 1, "its own trainer trained its step"
