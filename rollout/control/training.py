"""Training as calls: settings checked against the environment, the stack readied, a run that trains started.

Contract:
- `check_training` loads the environment and refuses, before anything starts, settings that cannot train it
  (a trainer model the engines do not serve, full weights on vLLM, a LoRA rank above vLLM's, evals half
  configured, a policy's own model or settings that cannot be: rollout.control.policy_models), each as a
  `ControlError` naming the setting.
- `run_input` turns settings (a preset plus overrides) into the run: the environment, `run.*` (groups in
  flight, max_lag, max_tokens, recorded as the run's settings, with each policy's base model when they are on
  several), `trainer.*` (steps, groups per batch, refill, advantages, each policy's own model and settings,
  given the `loaded` environment) and its launch record (rollout.run.launches: `trainer.*`, `gpu.*` and what
  the engines serve, and where environments are imported from), so a stack can be brought back to the run.
- `ready_stack` starts what is missing of the embedded stack for one environment (engine, gateway, runner, an
  engine per other base model its policies are on, trainer, the sandboxes its episodes claim, a command host
  per command seat in flight with `sandbox.command_pool`) and refuses an engine already serving another model.
- `begin_training` has a runner confirm it loads the environment, then starts the run's workflow, riding out
  a Temporal that the supervisor is restarting (the stack was just started); a run id already playing is
  refused.
- `start_training` is `rollout train` up to the live line, in that order: check, ready the embedded stack
  (not with `cluster`: the cluster's services play and train it), build the run (its id `run`, or the
  environment's name and a new suffix), start it. `report` hears each phase and what the stack starts; it
  answers what started (`TrainingStarted`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.control.connections import connect_temporal, ledger_session, local_model
from rollout.control.errors import ControlError
from rollout.control.policy_models import base_models, check_policy_models, own_models, policy_models
from rollout.control.waits import OUTAGE_S, patiently

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout.config import Settings
    from rollout.environment import Environment
    from rollout.stack.embedded import Stack
    from rollout.workflows.eval_types import EvalInput
    from rollout.workflows.run_types import RunInput

# `rollout train` starts (or restarts) the stack itself, so a service that dies before the run exists is being
# brought back by the supervisor: starting the run waits for it this long (the supervisor's backoff tops at 30
# s).
LOOK = "`rollout status` shows what runs, and the data directory's logs/ folder why a service stopped."


def check_training(settings: Settings, environment: str, *, cluster: bool = False) -> Environment:
    """The environment `environment` names, once `settings` can train it here (or on the cluster)."""
    from rollout.environment import EnvironmentLoadError, load_environment

    try:
        loaded = load_environment(environment)
    except EnvironmentLoadError as error:
        raise ControlError(f"{error}\nCheck it with `rollout env check {environment}`.", usage=True) from None
    check_policy_models(settings, loaded)
    if settings.trainer.model != settings.services.gateway.model:
        raise ControlError(
            f"trainer.model={settings.trainer.model} but the engines serve services.gateway.model="
            f"{settings.services.gateway.model}: set both to the same model"
        )
    if (
        settings.trainer.provider == "local"
        and not settings.trainer.lora_rank
        and settings.engine_kind == "vllm"
    ):
        raise ControlError(
            "a full-weight run (trainer.lora_rank=0) cannot be served by services.engine.kind=vllm yet (it loads "
            "LoRA adapters at run time; full weights would need a restart per checkpoint): train LoRA "
            "(trainer.lora_rank=32) or serve on services.engine.kind=local",
            usage=True,
        )
    engine = settings.services.engine
    if settings.engine_kind == "vllm" and settings.trainer.lora_rank > engine.vllm_max_lora_rank:
        raise ControlError(
            f"trainer.lora_rank={settings.trainer.lora_rank} is above what vLLM loads "
            f"(services.engine.vllm_max_lora_rank={engine.vllm_max_lora_rank}): raise that, or lower the rank",
            usage=True,
        )
    if (settings.eval.suite is None) != (settings.eval.every < 1):
        raise ControlError(
            "evals during training need both eval.suite=SUITE and eval.every=N (N ≥ 1)", usage=True
        )
    if not cluster and runs_agent_commands(loaded):
        from rollout.control.connections import refuse_without_jail

        refuse_without_jail(settings, f"{environment} runs commands its agents choose")
    return loaded


@dataclass(frozen=True)
class TrainingStarted:
    """A run that trains, started: its id, the policies it trains, its models in words (`smollm2`, or
    `speaker on smollm2, listener on tiny-qwen3`) and its steps."""

    run: str
    environment: str
    policies: list[str]
    models: str
    steps: int


def start_training(
    settings: Settings,
    environment: str,
    *,
    run: str | None = None,
    cluster: bool = False,
    report: Callable[[str], None] = lambda line: None,
) -> TrainingStarted:
    from rollout.control.policy_models import models_said
    from rollout.references import import_path
    from rollout.stack.embedded import Stack

    loaded = check_training(settings, environment, cluster=cluster)
    if not cluster:
        report("starting the stack…")
        ready_stack(Stack(settings), settings, loaded, report=report)
    run_id = run or f"{loaded.name}-{uuid.uuid4().hex[:6]}"
    given = run_input(
        settings,
        environment,
        run_id,
        import_path=import_path(),
        evaluation=asyncio.run(evaluation(settings)),
        loaded=loaded,
    )
    report("a runner loads the environment…")
    asyncio.run(begin_training(settings, given))
    return TrainingStarted(
        run_id, environment, trained_policies(loaded), models_said(settings, loaded), settings.trainer.steps
    )


def trained_policies(environment: Environment) -> list[str]:
    return [a.policy for a in environment.agents if a.trainable] or ["default"]


def ready_stack(
    stack: Stack, settings: Settings, environment: Environment, report: Callable[[str], None]
) -> None:
    """Start what is missing of the embedded stack to train `environment` (raises `ControlError`)."""
    from rollout.control.connections import stack_action
    from rollout.stack.sandboxes import sandboxes_needed

    def start() -> None:
        stack.up(report=report)
        check_engine_model(settings)
        if others := base_models(settings, environment)[1:]:  # an engine per other base model of its policies
            stack.keep_policy_engines(others, report=report)
        report("trainer: starting")
        stack.start_trainer()
        if environment.sandbox is not None:  # the sandboxes its episodes claim, one per episode in flight
            stack.keep_sandboxes(
                environment.sandbox.kind,
                seats=environment.sandbox.seats,
                count=sandboxes_needed(settings, environment.group_size),
                report=report,
            )
        commands = sum(1 for agent in environment.agents if agent.command)
        if commands and settings.sandbox.command_pool:  # a command host per command seat in flight
            stack.keep_sandboxes(
                settings.sandbox.command_pool,
                seats=1,
                count=commands * sandboxes_needed(settings, environment.group_size),
                report=report,
            )

    stack_action(start)


def serve_formats(settings: Settings) -> list[str]:
    """The bridge each checkpoint goes through for the stack's engine: Tinker's sampler path; a LoRA adapter
    where the engine loads adapters, else the adapter merged into full weights; full weights as they are."""
    from rollout.engines.factory import SERVED_FORMATS

    trainer = settings.trainer
    if trainer.provider == "tinker":
        return ["tinker"]
    loads = SERVED_FORMATS.get(settings.engine_kind.value, ("lora", "full"))
    return ["lora"] if trainer.lora_rank and "lora" in loads else ["merged"]


def run_input(
    settings: Settings,
    environment: str,
    run: str,
    *,
    import_path: Sequence[str] = (),
    evaluation: EvalInput | None = None,
    loaded: Environment | None = None,
) -> RunInput:
    from rollout.config.overrides import overrides_for
    from rollout.control.tracking import tracking_input
    from rollout.run.launches import LAUNCH_SECTIONS, RunLaunch
    from rollout.run.settings import RunSettings
    from rollout.workflows.run_types import RunInput
    from rollout.workflows.training_types import TrainingSpec

    trainer = settings.trainer
    training = TrainingSpec(
        steps=trainer.steps,
        groups_per_batch=trainer.groups_per_batch,
        advantage=trainer.advantage,
        refill=trainer.refill,
        refill_max=trainer.refill_max,
        serve_formats=serve_formats(settings),
        warm_start=trainer.warm_start,
        evaluation=evaluation,
        eval_every=settings.eval.every if evaluation is not None else 0,
        models=own_models(settings, loaded) if loaded is not None else {},
    )
    launch = RunLaunch(
        run=run,
        environment=environment,
        overrides=overrides_for(settings, *LAUNCH_SECTIONS),
        import_path=[str(Path(entry).resolve()) for entry in import_path if entry],
    )
    return RunInput(
        run=run,
        environment=environment,
        groups_in_flight=settings.run.groups_in_flight,
        max_failure_rate=settings.run.max_failure_rate,
        failure_window=settings.run.failure_window,
        settings=RunSettings(
            max_lag=settings.run.max_lag,
            max_tokens=settings.run.max_tokens,
            policy_models=policy_models(settings, loaded) if loaded is not None else {},
        ),
        training=training,
        launch=launch,
        tracking=tracking_input(settings, run, environment),
    )


async def evaluation(settings: Settings) -> EvalInput | None:
    """The eval every `eval.every`-th checkpoint gets (`eval.suite`, registered first, with `eval.gate`), or
    None."""
    from rollout.control.evals import eval_input, suite_named
    from rollout.workflows.eval_types import EvalGate

    if settings.eval.suite is None:
        return None
    async with ledger_session(settings) as ledger:
        suite = await suite_named(ledger, settings.eval.suite)
    given = eval_input(
        suite, checkpoint="", max_tokens=settings.run.max_tokens, in_flight=settings.eval.episodes_in_flight
    )
    gate = settings.eval.gate
    if gate.max_drop is not None:
        given.gate = EvalGate(max_drop=gate.max_drop, action=gate.action.value)
    return given


async def begin_training(settings: Settings, given: RunInput) -> None:
    """Confirm a runner loads the run's environment, then start the run; Temporal outages are waited out."""
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError

    from rollout.control.preflight import confirm_runner_loads, confirm_trainers_poll

    run, environment = given.run, given.environment
    # The stack was just started: a service that dies now is being restarted by the supervisor, so each step
    # waits it out (`patiently`) rather than stopping before the run exists.
    client = await connect_temporal(settings, patience_s=OUTAGE_S)
    try:
        await patiently(
            lambda: confirm_runner_loads(client, run, environment),
            f"a runner to check {environment}",
            settings,
            window_s=OUTAGE_S,
        )
        if given.training is not None:
            await confirm_trainers_poll(client, given.training)
    except RPCError as error:
        raise ControlError(
            f"Temporal stopped answering while a runner checked {environment} ({error.message}): {LOOK}"
        ) from None
    try:
        await _start_riding_outages(client, given)
    except RPCError as error:
        raise ControlError(
            f"Temporal stopped answering while run {run} was starting ({error.message}): {LOOK}"
        ) from None
    except WorkflowAlreadyStartedError:
        raise ControlError(
            f"run {run} is already playing: follow it with `rollout run attach {run}`, or train under another --run"
        ) from None


async def _start_riding_outages(client: Client, given: RunInput) -> None:
    """Start the run's workflow, trying again while Temporal is away (for `OUTAGE_S`). A retry that
    finds the run already playing found the start whose reply was lost; a run id already playing at the first
    try is refused (`WorkflowAlreadyStartedError`)."""
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError

    from rollout.workflows.client import start_run

    deadline = time.monotonic() + OUTAGE_S
    retried = False
    while True:
        try:
            await start_run(client, given)
            return
        except WorkflowAlreadyStartedError:
            if retried:
                return
            raise
        except RPCError:
            if time.monotonic() > deadline:
                raise
            retried = True
            await asyncio.sleep(1.0)


def served_roots(settings: Settings) -> set[str] | None:
    """The model paths the stack's engine serves (`/v1/models`' roots, asked with the engine API key); None
    when it does not answer."""
    import httpx

    from rollout.serving.keys import known_engine_api_key

    gateway = settings.services.gateway
    api_key = known_engine_api_key(settings.data_path)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    try:
        url = f"http://{gateway.engine_host}:{gateway.engine_port}/v1/models"
        answer = httpx.get(url, headers=headers, timeout=5)
        return {str(entry.get("root")) for entry in answer.json()["data"]}
    except (httpx.HTTPError, KeyError, ValueError, TypeError, AttributeError):
        return None


def serves_another_model(settings: Settings, model: str) -> str | None:
    """What the running engine serves instead of `model` (a spec), or None when it serves it (or is down)."""
    roots = served_roots(settings)
    if roots is None or "scripted" in roots or local_model(model, settings) in roots:
        return None
    return ", ".join(sorted(roots)) or "nothing"


def check_engine_model(settings: Settings) -> None:
    """The running engine must serve the model being trained (a stack started earlier may serve another)."""
    if (served := serves_another_model(settings, settings.services.gateway.model)) is not None:
        raise ControlError(
            f"the running engine serves {served}, not {settings.services.gateway.model}: stop the stack "
            "with `rollout down` (or choose another data_dir=) and train again"
        )


def runs_agent_commands(environment: Environment) -> bool:
    """Whether an environment's episodes run what its agents drive in a jail: a command seat, or a sandbox
    kind that is jailed (a shell's commands, a Minecraft world)."""
    from rollout.sandbox import load_kind
    from rollout.sandbox.world import UnknownSandboxKind, jailed

    if any(agent.command for agent in environment.agents):
        return True
    if environment.sandbox is None:
        return False
    try:
        return jailed(load_kind(environment.sandbox.kind))
    except UnknownSandboxKind:
        return False  # its sandboxes fail to start, and say why
