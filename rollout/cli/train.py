"""`rollout train`: start what is missing, start a run that trains, and show it live until it is done
(rollout.control.training.start_training does the work; rollout.cli.live shows it)."""

from __future__ import annotations

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
    from rollout.control.training import start_training

    if cluster:
        settings = cluster_settings(preset, overrides)
    else:
        settings = load_settings([f"preset={preset}", *(overrides or [])])
    with err.status("checking the settings…") as spinner:
        started = start_training(settings, environment, run=run, cluster=cluster, report=spinner.update)
    err.print(f"run {started.run}: training {started.models} for {started.steps} steps on {environment}")
    follow_to_the_end(settings, started.run, started.policies, as_json=as_json, embedded=not cluster)


def register(app: typer.Typer) -> None:
    app.command()(train)
