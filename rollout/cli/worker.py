"""`rollout worker runner|trainer`: worker processes (several may run, on several machines)."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from rollout.cli.common import Overrides, as_service, err, fail, load_settings
from rollout.cli.placement import (
    GpusOption,
    PlacementOption,
    RayAddressOption,
    RayGroupOption,
    check_placement,
    rerun_on_ray,
)
from rollout.control.workers import RUNNER_QUEUE, TRAINER_QUEUE

app = typer.Typer(help="Worker processes (several may run, on several machines).", no_args_is_help=True)


@app.command("runner")
def runner(
    overrides: Overrides = None,
    gateway_url: Annotated[
        str | None, typer.Option(help="The gateway agents sample through (default: services.gateway).")
    ] = None,
    task_queue: Annotated[str, typer.Option(help="The Temporal task queue to poll.")] = RUNNER_QUEUE,
    max_activities: Annotated[
        int, typer.Option(help="How many agents (and other activities) this runner plays at once.")
    ] = 64,
) -> None:
    """Run a runner worker: it plays episodes (the built-in agent loop and external agent commands).

    It imports environments from the directory it runs in and from $PYTHONPATH, as `rollout env check` does.
    """
    from rollout.control.workers import serve_runner
    from rollout.sandbox.keys import load_sandbox_key

    settings = load_settings(overrides)
    as_service(settings, load_sandbox_key(settings.data_path))
    with contextlib.suppress(KeyboardInterrupt):
        serve_runner(
            settings,
            gateway_url=gateway_url,
            task_queue=task_queue,
            max_activities=max_activities,
            say=err.print,
        )


@app.command("trainer")
def trainer(
    overrides: Overrides = None,
    task_queue: Annotated[str, typer.Option(help="The Temporal task queue to poll.")] = TRAINER_QUEUE,
    holder: Annotated[
        str | None, typer.Option(help="This trainer's name in its leases (default: trainer-HOST-PID).")
    ] = None,
    placement: PlacementOption = "here",
    ray_address: RayAddressOption = None,
    gpus: GpusOption = 0.0,
    ray_group: RayGroupOption = None,
) -> None:
    """Run a trainer worker: it trains steps (`trainer.*` settings; `trainer.provider=tinker` trains through
    Tinker's API, with `trainer.tinker_base_model=` and TINKER_API_KEY), bridges each checkpoint for the
    engines and publishes it for serving. Runs started with training (`rollout train`) need one."""
    from rollout.control.workers import prepare_trainer, serve_trainer

    settings = load_settings(overrides)
    as_service(settings)
    check_placement(placement)
    if placement == "ray":
        if gpus <= 0 and (settings.trainer.device or "").startswith("cuda"):
            fail("trainer.device=cuda on Ray needs a GPU: give the trainer one with `--gpus 1`", code=2)
        rerun_on_ray("trainer worker", gpus=gpus, address=ray_address, group=ray_group)
        return
    with err.status(f"preparing {settings.trainer.model}…"):
        prepared = prepare_trainer(settings)
    with contextlib.suppress(KeyboardInterrupt):
        serve_trainer(settings, prepared, task_queue=task_queue, holder=holder, say=err.print)
