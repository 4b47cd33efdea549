"""`rollout train`: start what is missing, start a run that trains, and show it live until it is done
(rollout.control.training does the work; rollout.cli.live shows it)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

import typer

from rollout.cli.cluster import ClusterFlag, cluster_settings
from rollout.cli.common import JsonFlag, Overrides, err, load_settings


def train(
    environment: Annotated[str, typer.Argument(help="The environment, as package.module:attribute.")],
    overrides: Overrides = None,
    preset: Annotated[
        str,
        typer.Option(
            help="cpu-quickstart (SmolLM2-135M + LoRA on CPU, 40 steps: the README's first run), cpu-micro (a tiny "
            "random model, for CI), cpu-tiny (SmolLM2-135M + LoRA on CPU, 600 steps); with --cluster, "
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

    With --cluster the run starts on the current cluster context (`rollout cluster connect`) and nothing
    starts here: the cluster's runners play it and its trainer trains it (with the trainer settings the
    release was deployed with), and --preset NAME[@VERSION] is the preset as the cluster's ledger stores it
    (`rollout preset load DIR --cluster`), else the built-in one. The cluster's runners must be able to import
    ENVIRONMENT.
    """
    from rollout.cli.live import follow_to_the_end
    from rollout.control.policy_models import models_said
    from rollout.control.training import (
        begin_training,
        check_training,
        evaluation,
        ready_stack,
        run_input,
        trained_policies,
    )
    from rollout.references import import_path
    from rollout.stack.embedded import Stack

    if cluster:
        settings = cluster_settings(preset, overrides)
    else:
        settings = load_settings([f"preset={preset}", *(overrides or [])])
    loaded = check_training(settings, environment, cluster=cluster)
    if not cluster:
        with err.status("starting the stack…") as spinner:
            ready_stack(Stack(settings), settings, loaded, report=lambda line: spinner.update(line))
    run_id = run or f"{loaded.name}-{uuid.uuid4().hex[:6]}"
    given = run_input(
        settings,
        environment,
        run_id,
        import_path=import_path(),
        evaluation=asyncio.run(evaluation(settings)),
        loaded=loaded,
    )
    with err.status("a runner loads the environment…"):
        asyncio.run(begin_training(settings, given))
    models = models_said(settings, loaded)
    err.print(f"run {run_id}: training {models} for {settings.trainer.steps} steps on {environment}")
    follow_to_the_end(settings, run_id, trained_policies(loaded), as_json=as_json, embedded=not cluster)


def register(app: typer.Typer) -> None:
    app.command()(train)
