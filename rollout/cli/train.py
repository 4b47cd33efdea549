"""`rollout train`: start what is missing, start a run that trains, and show it live until it is done."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollout.cli.cluster import ClusterFlag, cluster_settings
from rollout.cli.common import (
    JsonFlag,
    Overrides,
    connect_temporal,
    err,
    fail,
    guarded,
    load_settings,
    local_model,
    out,
    refuse_without_jail,
)

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout.cli.training_view import TrainingProgress
    from rollout.config import Settings
    from rollout.environment import Environment
    from rollout.workflows.types import EvalInput, RunInput, RunStatus

# `rollout train` starts (or restarts) the stack itself, so a service that dies before the run exists is being
# brought back by the supervisor: starting the run waits for it this long (the supervisor's backoff tops at 30 s).
TEMPORAL_OUTAGE_S = 120.0
LOOK = "`rollout status` shows what runs, and the data directory's logs/ folder why a service stopped."


def train(
    environment: Annotated[str, typer.Argument(help="The environment, as package.module:attribute.")],
    overrides: Overrides = None,
    preset: Annotated[
        str,
        typer.Option(
            help="cpu-micro (a tiny random model, for CI), cpu-tiny (SmolLM2-135M + LoRA on CPU); with --cluster, "
            "also the presets stored in the cluster's ledger (NAME or NAME@VERSION)."
        ),
    ] = "none",
    run: Annotated[str | None, typer.Option("--run", help="The run's id (default: a new one).")] = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Train a policy on ENVIRONMENT: starts what is missing (stack, engine, gateway, runner, trainer, and the
    sandboxes the environment's episodes claim), starts a run that trains `trainer.steps` steps while episodes
    keep playing, and shows it live.

    ENVIRONMENT is found as `rollout env check` finds it: installed packages, the folder you run from, and
    $PYTHONPATH; the stack's runner imports from the same places. Overrides after the environment:
    `trainer.steps=5 trainer.learning_rate=1e-4 run.max_lag=2`. Ctrl-C pauses the run (it stays paused across
    restarts); `rollout run attach RUN` resumes it and shows it again.

    With --cluster the run starts on the current cluster context (`rollout cluster connect`) and nothing starts
    here: the cluster's runners play it and its trainer trains it (with the trainer settings the release was
    deployed with), and --preset NAME[@VERSION] is the preset as the cluster's ledger stores it (`rollout preset
    load DIR --cluster`), else the built-in one. The cluster's runners must be able to import ENVIRONMENT.
    """
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError

    from rollout.cli.live import outlasting
    from rollout.cli.preflight import PreflightFailed, confirm_runner_loads
    from rollout.cli.training_view import run_input
    from rollout.environment import EnvironmentLoadError, load_environment
    from rollout.references import import_path
    from rollout.stack.embedded import Stack
    from rollout.stack.sandboxes import sandboxes_needed

    if cluster:
        settings = cluster_settings(preset, overrides)
    else:
        settings = load_settings([f"preset={preset}", *(overrides or [])])
    try:
        loaded = load_environment(environment)
    except EnvironmentLoadError as error:
        fail(f"{error}\nCheck it with `rollout env check {environment}`.", code=2)
    if settings.trainer.model != settings.services.gateway.model:
        fail(
            f"trainer.model={settings.trainer.model} but the engines serve services.gateway.model="
            f"{settings.services.gateway.model}: set both to the same model"
        )
    if (
        settings.trainer.provider == "local"
        and not settings.trainer.lora_rank
        and settings.engine_kind == "vllm"
    ):
        fail(
            "a full-weight run (trainer.lora_rank=0) cannot be served by services.engine.kind=vllm yet (it loads "
            "LoRA adapters at run time; full weights would need a restart per checkpoint): train LoRA "
            "(trainer.lora_rank=32) or serve on services.engine.kind=local",
            code=2,
        )
    engine = settings.services.engine
    if settings.engine_kind == "vllm" and settings.trainer.lora_rank > engine.vllm_max_lora_rank:
        fail(
            f"trainer.lora_rank={settings.trainer.lora_rank} is above what vLLM loads "
            f"(services.engine.vllm_max_lora_rank={engine.vllm_max_lora_rank}): raise that, or lower the rank",
            code=2,
        )
    if not cluster and _runs_agent_commands(loaded):
        refuse_without_jail(settings, f"{environment} runs commands its agents choose")
    stack = Stack(settings)

    def start_stack() -> None:
        with err.status("starting the stack…") as spinner:
            stack.up(report=lambda line: spinner.update(line))
            _check_engine_model(settings, local_model(settings.services.gateway.model, settings))
            spinner.update("trainer: starting")
            stack.start_trainer()
            if loaded.sandbox is not None:  # the sandboxes its episodes claim, one per episode in flight
                stack.keep_sandboxes(
                    loaded.sandbox.kind,
                    seats=loaded.sandbox.seats,
                    count=sandboxes_needed(settings, loaded.group_size),
                    report=lambda line: spinner.update(line),
                )

    if (settings.eval.suite is None) != (settings.eval.every < 1):
        fail("evals during training need both eval.suite=SUITE and eval.every=N (N ≥ 1)", code=2)
    if not cluster:
        guarded(start_stack)
    run_id = run or f"{loaded.name}-{uuid.uuid4().hex[:6]}"
    given = run_input(
        settings,
        environment,
        run_id,
        import_path=os.pathsep.join(import_path()),
        evaluation=_evaluation(settings),
    )
    policies = [a.policy for a in loaded.agents if a.trainable] or ["default"]

    async def begin() -> None:
        # The stack was just started: a service that dies now is being restarted by the supervisor, so each
        # step waits it out (`outlasting`) rather than stopping before the run exists.
        client = await connect_temporal(settings, patience_s=TEMPORAL_OUTAGE_S)
        try:
            await outlasting(lambda: confirm_runner_loads(client, run_id, environment), TEMPORAL_OUTAGE_S)
        except PreflightFailed as error:
            fail(str(error), code=2)
        except RPCError as error:
            fail(f"Temporal stopped answering while a runner checked {environment} ({error.message}): {LOOK}")
        try:
            await _start_riding_outages(client, given)
        except RPCError as error:
            fail(f"Temporal stopped answering while run {run_id} was starting ({error.message}): {LOOK}")
        except WorkflowAlreadyStartedError:
            fail(
                f"run {run_id} is already playing: follow it with `rollout run attach {run_id}`, or train under "
                "another --run"
            )

    with err.status("a runner loads the environment…"):
        asyncio.run(begin())
    err.print(
        f"run {run_id}: training {settings.trainer.model} for {settings.trainer.steps} steps on {environment}"
    )
    follow_to_the_end(settings, run_id, policies[0], as_json=as_json)


def _evaluation(settings: Settings) -> EvalInput | None:
    """The eval every `eval.every`-th checkpoint gets (`eval.suite`, registered first), or None."""
    if settings.eval.suite is None:
        return None
    from rollout.cli.evals import eval_input, suite_named
    from rollout.ledger import Ledger
    from rollout.ledger.errors import LedgerError

    async def find() -> EvalInput:
        assert settings.eval.suite is not None
        async with await Ledger.connect(settings.ledger_url) as ledger:
            suite = await suite_named(ledger, settings.eval.suite)
            return eval_input(suite, checkpoint="", max_tokens=settings.run.max_tokens)

    try:
        return asyncio.run(find())
    except LedgerError as error:
        fail(f"{error}\n`rollout status` shows the stack.")


async def _start_riding_outages(client: Client, given: RunInput) -> None:
    """Start the run's workflow, trying again while Temporal is away (for `TEMPORAL_OUTAGE_S`). A retry that finds
    the run already playing found the start whose reply was lost; a run id already playing at the first try is
    refused (`WorkflowAlreadyStartedError`)."""
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError

    from rollout.workflows.client import start_run

    deadline = time.monotonic() + TEMPORAL_OUTAGE_S
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


def follow_to_the_end(settings: Settings, run: str, policy: str, *, as_json: bool) -> None:
    """Show run `run` live until it ends, then its summary; Ctrl-C pauses it and says how to come back."""
    from rollout.cli.live import follow_training, outlasting, print_summary
    from rollout.cli.run import update_run
    from rollout.cli.training_view import TrainingProgress
    from rollout.ledger import Ledger
    from rollout.workflows.client import run_handle

    progress = TrainingProgress(run, policy)
    # The pool's own warnings about a lost server would break the progress line, which says it better.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

    async def follow() -> tuple[RunStatus, TrainingProgress]:
        client = await connect_temporal(settings)
        handle = run_handle(client, run)
        # A short reconnect window: the live line says what it waits for instead of hanging in a ledger call.
        ledger = await outlasting(lambda: Ledger.connect(settings.ledger_url, reconnect_window_s=3))
        async with ledger:
            return await follow_training(ledger, handle, progress), progress

    try:
        status, progress = asyncio.run(follow())
    except KeyboardInterrupt:
        update_run(settings, run, "pause")
        err.print(
            f"\npaused run {run}. Come back to it with `rollout run attach {run}` (it resumes the run and restarts "
            "its trainer); the stack keeps running."
        )
        raise typer.Exit(130) from None
    evals = _eval_scores(settings, run)
    if as_json:
        print(json.dumps(progress.summary() | {"episodes_failed": status.episodes_failed, "evals": evals}))
        return
    print_summary(progress, status)
    for scored in evals:
        scores = ", ".join(f"{e} {v:.3f}" for e, v in scored["scores"].items())
        out.print(f"eval {scored['suite']} of {scored['checkpoint']}: {scores}", highlight=False)


def _eval_scores(settings: Settings, run: str) -> list[dict[str, Any]]:
    """The eval scores of this run's checkpoints (`eval.every`), by checkpoint: [] when none were asked for or
    the ledger cannot be read now."""
    if settings.eval.suite is None:
        return []
    from rollout.evals.records import results
    from rollout.ledger import Ledger
    from rollout.ledger.errors import LedgerError

    async def read() -> list[dict[str, Any]]:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            found = [r for r in await results(ledger) if (r.policy or "").startswith(f"{run}/")]
        by_checkpoint: dict[str, dict[str, Any]] = {}
        for r in sorted(found, key=lambda r: r.checkpoint_version):
            entry = by_checkpoint.setdefault(
                r.checkpoint, {"suite": f"{r.suite}@{r.version}", "checkpoint": r.checkpoint, "scores": {}}
            )
            entry["scores"][r.environment] = r.score
        return list(by_checkpoint.values())

    try:
        return asyncio.run(read())
    except LedgerError:
        return []


def _check_engine_model(settings: Settings, model_path: str) -> None:
    """The running engine must serve the model being trained (a stack started earlier may serve another)."""
    import httpx

    gateway = settings.services.gateway
    try:
        models = httpx.get(f"http://{gateway.engine_host}:{gateway.engine_port}/v1/models", timeout=5).json()[
            "data"
        ]
    except (httpx.HTTPError, KeyError, ValueError):
        return  # unreachable: `up` reported it
    roots = {entry.get("root") for entry in models}
    if model_path not in roots and "scripted" not in roots:
        fail(
            f"the running engine serves {', '.join(str(r) for r in roots)}, not {gateway.model}: stop the stack "
            "with `rollout down` (or choose another data_dir=) and train again"
        )


def register(app: typer.Typer) -> None:
    app.command()(train)


def _runs_agent_commands(environment: Environment) -> bool:
    """Whether an environment's episodes run what its agents drive in a jail: a command seat, or a sandbox kind
    that is jailed (a shell's commands, a Minecraft world)."""
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
