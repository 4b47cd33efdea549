"""Shared fixtures (a pytest plugin, loaded by the root conftest so docs examples can use them too).

One real embedded stack (Postgres + Temporal dev server) serves the whole test run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from psycopg import sql

from rollout.config import Settings
from rollout.ledger import Ledger, migrate
from rollout.stack.embedded import Stack
from rollout_testing.cluster import Cluster
from rollout_testing.stacks import isolated_settings

if TYPE_CHECKING:
    from rollout.rendering import ModelRenderer
    from rollout_testing.otlp_receiver import OtlpReceiver


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    settings = isolated_settings(tmp_path_factory.mktemp("stack"))
    stack = Stack(settings)
    try:
        unhealthy = [f"{s.name}: {s.detail}" for s in stack.up() if not s.healthy]
        assert not unhealthy, "the test stack did not come up: " + "; ".join(unhealthy)
        yield settings
    finally:
        stack.down()  # also when it came up only in part: leave no process behind


@pytest.fixture(scope="session")
def ledger_url(stack_settings: Settings) -> str:
    return stack_settings.ledger_url


@pytest.fixture(scope="module")
def database(stack_settings: Settings) -> Iterator[str]:
    """A ledger database of the module's own on the session's server, migrated (its name), for tests that
    append what the shared ledger's readers must never meet. Roles belong to the server, grants to the
    database: the writer logins reach it as they reach the shared one."""
    name = f"own_{uuid.uuid4().hex[:8]}"
    migrate.upgrade(migrate._with_database(stack_settings.ledger_url, name))
    yield name
    with psycopg.connect(
        migrate._with_database(stack_settings.ledger_url, "postgres"), autocommit=True
    ) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
async def ledger(ledger_url: str) -> AsyncIterator[Ledger]:
    async with await Ledger.connect(ledger_url) as opened:
        yield opened


@pytest.fixture
def stream() -> str:
    """A stream name no other test uses."""
    return f"test/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """Built-in models, built once per machine and kept between test runs (they are deterministic)."""
    path = Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3(models_dir: Path) -> str:
    from rollout.engines.models import TINY_QWEN3, resolve

    return resolve(TINY_QWEN3, models_dir)


@pytest.fixture(scope="session")
def renderer(tiny_qwen3: str) -> ModelRenderer:
    """The tiny Qwen3 model's renderer (its tokenizer and chat template), for gateways under test."""
    from transformers import AutoTokenizer

    from rollout.rendering import ModelRenderer

    return ModelRenderer(AutoTokenizer.from_pretrained(tiny_qwen3), "qwen3")


@pytest.fixture
async def seat(ledger: Ledger, tmp_path: Path) -> tuple[str, str]:
    """A seat of no run: (its id, its token)."""
    from rollout.gateway.seats import load_secret, open_seat

    seat_id = f"seat-{uuid.uuid4().hex[:10]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent="solver")
    return seat_id, token


@pytest.fixture(scope="session")
def minecraft_home() -> Path:
    """The minecraft kind's packages, installed once per machine (npm) and shared by every data directory:
    set for this process and every process a test starts."""
    from rollout.sandbox.minecraft.install import HOME_VARIABLE, ensure_installed

    path = Path(
        os.environ.get("ROLLOUT_TEST_MINECRAFT_HOME", Path.home() / ".cache" / "rollout-tests" / "minecraft")
    )
    ensure_installed(path)
    os.environ[HOME_VARIABLE] = str(path)
    return path


@pytest.fixture
def cluster(stack_settings: Settings, tmp_path: Path, models_dir: Path, tiny_qwen3: str) -> Iterator[Cluster]:
    """Rollout's services as real, killable processes (chaos tests); every one is stopped at the end."""
    made = Cluster(
        settings=stack_settings,
        root=tmp_path / "cluster",
        models_dir=models_dir,
        task_queue=f"chaos-{uuid.uuid4().hex[:8]}",
    )
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="session")
def monitor_settings(stack_settings: Settings, models_dir: Path, tiny_qwen3: str) -> Settings:
    """The session stack as the dashboard reads it."""
    from rollout import config
    from rollout_testing.stacks import monitor_overrides

    return config.load(monitor_overrides(stack_settings, models_dir))


@pytest.fixture(scope="session")
def trained_run_tracking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where `trained_run`'s runner wrote its tracking files: W&B's offline run under `wandb-files/`, the
    MLflow local store under `mlflow/`."""
    return tmp_path_factory.getbasetemp() / "trained-run" / "tracking"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` on loopback (its own sqlite store and artifacts): its tracking URI."""
    import subprocess
    import sys

    from rollout.net import free_port
    from rollout.stack.processes import wait_for_http

    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    # Without this the server starts a job runner and its huey consumers, which poll for jobs we never submit:
    # a fifth of a core for the rest of the session.
    environment = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(root / "server.log", "wb") as log:
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)),
                *("--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"),
                *("--artifacts-destination", str(root / "artifacts")),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", server, timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP trace receiver on loopback (OpenTelemetry's own message classes) for the session."""
    from rollout_testing.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="session")
def trained_run(
    stack_settings: Settings,
    tiny_qwen3: str,
    trained_run_tracking: Path,
    otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """A finished two-step run on the session stack whose checkpoints were each scored by an eval (for the
    dashboard's tests), tracked to W&B (offline) and MLflow's local store (`trained_run_tracking`), a table of
    samples every step, its traces exported to `otlp_receiver`; its tracking feed has ended."""
    import asyncio
    from dataclasses import replace

    from rollout.control.evals import eval_input
    from rollout.evals import EvalEnvironment, Suite
    from rollout.evals.records import register
    from rollout.workflows.names import run_workflow_id, tracking_workflow_id
    from rollout.workflows.run import RunWorkflow
    from rollout.workflows.tracking_types import MlflowSpec, OtlpSpec, TrackingInput, WandbSpec
    from tests.test_training_loop import run_input, training_loop

    async def train() -> str:
        async with await Ledger.connect(stack_settings.ledger_url) as ledger:
            suite = Suite(
                f"monitor-{uuid.uuid4().hex[:6]}",
                "1",
                (EvalEnvironment("tests.example_envs:coin", episodes=2, max_tokens=4),),
            )
            await register(ledger, suite)
            scratch = trained_run_tracking.parent
            scratch.mkdir(parents=True, exist_ok=True)
            async with training_loop(stack_settings, ledger, tiny_qwen3, scratch) as loop:
                given = run_input(loop, 2)
                assert given.training is not None
                given.training = replace(given.training, evaluation=eval_input(suite, ""), eval_every=1)
                given.tracking = TrackingInput(
                    loop.run,
                    policies=[],
                    wandb=WandbSpec(project="rollout-tests", offline=True),
                    mlflow=MlflowSpec(experiment="rollout-tests"),
                    otlp=OtlpSpec(otlp_receiver.url),
                    samples_every=1,
                    samples=2,
                    config={"trainer.steps": "2"},
                    eval_every=1,
                )
                await loop.client.execute_workflow(
                    RunWorkflow.run, given, id=run_workflow_id(loop.run), task_queue=loop.queue
                )
                # The feed ends once it has logged what the run's end recorded, its last evals included.
                await loop.client.get_workflow_handle(tracking_workflow_id(loop.run)).result()
                return loop.run

    return asyncio.run(train())
