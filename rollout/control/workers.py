"""Runner and trainer worker processes, as calls (`rollout worker runner|trainer` parses its options and calls
these; several may run, on several machines).

Contract:
- `serve_runner` and `serve_trainer` connect to Temporal and to the ledger as the worker's own login
  (`LedgerWriter.runner`, `.trainer`), build the worker, say what it serves through `say`, and run it until
  the process is interrupted. A ledger that cannot be reached is `Unreachable`.
- `prepare_trainer` checks the trainer's settings (a wrong one is a `ControlError` of usage, naming it) and
  readies its model (the built-in ones are made once) before anything connects: `serve_trainer` takes what it
  made. `trainer.gpu_lease` comes from `gpu.*`, as `gpu.mode=shared` names the lease.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rollout.control.connections import blob_store, connect_temporal, ledger_session, local_model
from rollout.control.errors import ControlError
from rollout.workflows.names import RUNNER_QUEUE, TRAINER_QUEUE

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.worker import Worker

    from rollout.config import LedgerWriter, Settings, TrainerSettings
    from rollout.ledger import Ledger

__all__ = [
    "RUNNER_QUEUE",
    "TRAINER_QUEUE",
    "PreparedTrainer",
    "prepare_trainer",
    "serve_runner",
    "serve_trainer",
]


def _serve(
    settings: Settings, writer: LedgerWriter, build: Callable[[Client, Ledger], Awaitable[Worker]]
) -> None:
    async def serve() -> None:
        client = await connect_temporal(settings)
        async with ledger_session(settings, url=settings.writer_ledger_url(writer)) as ledger:
            await (await build(client, ledger)).run()

    asyncio.run(serve())


def serve_runner(
    settings: Settings,
    *,
    gateway_url: str | None,
    task_queue: str,
    max_activities: int,
    say: Callable[[str], None],
) -> None:
    """A runner worker: it plays episodes (the built-in agent loop and external agent commands), sampling
    through `gateway_url` (default: services.gateway)."""
    from rollout.config import LedgerWriter
    from rollout.gateway.seats import load_secret
    from rollout.sandbox.keys import load_sandbox_key
    from rollout.workers.runner import runner_worker

    gateway = settings.services.gateway
    url = gateway_url or f"http://{gateway.host}:{gateway.port}"
    sandbox_key = load_sandbox_key(settings.data_path)

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
        say(f"runner worker on queue {task_queue!r}, agents sample through {url}")
        return worker

    _serve(settings, LedgerWriter.runner, build)


@dataclass(frozen=True)
class PreparedTrainer:
    """A trainer's checked settings and its model's local path (None where a provider holds the model)."""

    spec: TrainerSettings
    model_path: str | None


def prepare_trainer(settings: Settings) -> PreparedTrainer:
    from rollout.activities.trainer_setup import TrainerSetupError, check_trainer_settings
    from rollout.config import TrainerProvider

    spec = replace(settings.trainer, gpu_lease=settings.gpu_lease)
    try:
        check_trainer_settings(spec)
    except TrainerSetupError as error:
        raise ControlError(str(error), usage=True) from None
    local = spec.provider == TrainerProvider.local
    return PreparedTrainer(spec, local_model(spec.model, settings) if local else None)


def serve_trainer(
    settings: Settings,
    prepared: PreparedTrainer,
    *,
    task_queue: str,
    holder: str | None,
    say: Callable[[str], None],
) -> None:
    """A trainer worker named `holder` (default: trainer-HOST-PID): it trains steps, bridges each checkpoint
    for the engines and publishes it for serving."""
    from rollout.activities.trainer_setup import trainer_activities
    from rollout.config import LedgerWriter
    from rollout.serving.keys import load_serving_key
    from rollout.workers.trainer import trainer_worker

    store = blob_store(settings)
    name = holder or f"trainer-{socket.gethostname()}-{os.getpid()}"

    async def build(client: Client, ledger: Ledger) -> Worker:
        built = trainer_activities(
            prepared.spec,
            ledger,
            store,
            model_path=prepared.model_path,
            holder=name,
            scratch=settings.data_path / "trainer" / name,
            resolve=lambda model: local_model(model, settings),
            serving_key=load_serving_key(settings.data_path),
        )
        say(f"trainer worker {name} on queue {task_queue!r}, training {built.describe}")
        return trainer_worker(client, built.training, built.bridges, task_queue=task_queue)

    _serve(settings, LedgerWriter.trainer, build)
