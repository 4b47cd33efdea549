"""`rollout worker runner|trainer`: worker processes (several may run, on several machines)."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

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
from rollout.control.connections import blob_store, connect_temporal, local_model
from rollout.workflows.names import RUNNER_QUEUE, TRAINER_QUEUE

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.worker import Worker

    from rollout.config import LedgerWriter, Settings
    from rollout.ledger import Ledger

app = typer.Typer(help="Worker processes (several may run, on several machines).", no_args_is_help=True)


def _serve_worker(
    settings: Settings, writer: LedgerWriter, build: Callable[[Client, Ledger], Awaitable[Worker]]
) -> None:
    """Connect to Temporal and the ledger (as `writer`'s login), build the worker, and run it until
    interrupted."""
    from rollout.ledger import Ledger
    from rollout.ledger.errors import LedgerError

    async def serve() -> None:
        client = await connect_temporal(settings)
        async with await Ledger.connect(settings.writer_ledger_url(writer)) as ledger:
            await (await build(client, ledger)).run()

    try:
        asyncio.run(serve())
    except LedgerError as error:
        fail(str(error))
    except KeyboardInterrupt:
        pass


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
    from rollout.gateway.seats import load_secret
    from rollout.sandbox.keys import load_sandbox_key
    from rollout.workers.runner import runner_worker

    settings = load_settings(overrides)
    gateway = settings.services.gateway
    url = gateway_url or f"http://{gateway.host}:{gateway.port}"
    sandbox_key = load_sandbox_key(settings.data_path)
    as_service(settings, sandbox_key)

    async def build(client: Client, ledger: Ledger) -> Worker:
        worker = runner_worker(
            client,
            ledger,
            gateway_url=url,
            seat_secret=load_secret(settings.data_path / "gateway.secret"),
            sandbox_key=sandbox_key,
            task_queue=task_queue,
            max_concurrent_activities=max_activities,
            outage_window_s=gateway.outage_window_s,
            isolation=settings.sandbox.isolation,
            command_pool=settings.sandbox.command_pool,
            tracking_dir=settings.data_path / "tracking",
        )
        err.print(f"runner worker on queue {task_queue!r}, agents sample through {url}")
        return worker

    from rollout.config import LedgerWriter

    _serve_worker(settings, LedgerWriter.runner, build)


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
    from rollout.activities.trainer_setup import TrainerSetupError, check_trainer_settings, trainer_activities
    from rollout.config import TrainerProvider
    from rollout.serving import load_serving_key
    from rollout.workers.trainer import trainer_worker

    settings = load_settings(overrides)
    as_service(settings)
    check_placement(placement)
    if placement == "ray":
        if gpus <= 0 and (settings.trainer.device or "").startswith("cuda"):
            fail("trainer.device=cuda on Ray needs a GPU: give the trainer one with `--gpus 1`", code=2)
        rerun_on_ray("trainer worker", gpus=gpus, address=ray_address, group=ray_group)
        return
    spec = replace(settings.trainer, gpu_lease=settings.gpu_lease)  # gpu.mode=shared names the lease
    try:
        check_trainer_settings(spec)
    except TrainerSetupError as error:
        fail(str(error), code=2)
    model_path = None
    if spec.provider == TrainerProvider.local:
        with err.status(f"preparing {spec.model}…"):
            model_path = local_model(spec.model, settings)
    store = blob_store(settings)
    name = holder or f"trainer-{socket.gethostname()}-{os.getpid()}"

    async def build(client: Client, ledger: Ledger) -> Worker:
        built = trainer_activities(
            spec,
            ledger,
            store,
            model_path=model_path,
            holder=name,
            scratch=settings.data_path / "trainer" / name,
            resolve=lambda model: local_model(model, settings),
            serving_key=load_serving_key(settings.data_path),
        )
        err.print(f"trainer worker {name} on queue {task_queue!r}, training {built.describe}")
        return trainer_worker(client, built.training, built.bridges, task_queue=task_queue)

    from rollout.config import LedgerWriter

    _serve_worker(settings, LedgerWriter.trainer, build)
