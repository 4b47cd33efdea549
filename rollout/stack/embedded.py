"""`rollout up / status / down`: start, inspect and stop what the configuration does not point elsewhere.

Contract:
- A service with a URL configured is external: `up` starts nothing for it and only checks it.
- `up` is idempotent and serialised by a lock file in the data directory: running it twice, or from two
  shells at once, leaves one of each service running. It migrates the ledger to the newest schema.
- `down` stops only what `up` started (embedded services), and is a no-op when nothing runs.
- `status` never changes anything; every service reports its address, health and a one-line detail.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import psycopg

from rollout.blobs import open_store
from rollout.config import Settings
from rollout.ledger import migrate
from rollout.ledger.errors import redact
from rollout.stack.managed import ManagedProcess
from rollout.stack.postgres import CorruptDataDirError, EmbeddedPostgres
from rollout.stack.temporal import EmbeddedTemporal
from rollout.workflows.names import RUNNER_QUEUE, TRAINER_QUEUE

Mode = Literal["embedded", "external"]


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    mode: Mode
    address: str
    healthy: bool
    detail: str
    pid: int | None = None
    ui_url: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class Stack:
    """The embedded stack of `settings`. `import_path` is where its runner imports environments from beyond the
    installed packages (default: the caller's working directory and $PYTHONPATH, `rollout.references`); a runner
    already running keeps the entries it has and is restarted by `up` when this one adds any."""

    def __init__(self, settings: Settings, import_path: list[str] | None = None) -> None:
        self.settings = settings
        self.data_dir = settings.data_path
        services = settings.services
        self.postgres = (
            None
            if services.postgres.url
            else EmbeddedPostgres(self.data_dir, services.postgres.host, services.postgres.port)
        )
        gateway = services.gateway
        self.engine: ManagedProcess | None = None
        self.gateway: ManagedProcess | None = None
        self.runner: ManagedProcess | None = None
        self.trainer: ManagedProcess | None = None
        if gateway.enabled:
            python = (sys.executable, "-m", "rollout.cli")
            common = (
                f"data_dir={self.data_dir}",
                f"models_dir={settings.models_dir}",
                f"log_level={settings.log_level.value}",
            )
            # Services connect as the worker role (no UPDATE or DELETE on the ledger) and are not told the owner's
            # URL: it is theirs only when no worker URL is known (a server of your own without
            # services.postgres.worker_url).
            ledger_urls = (f"services.postgres.worker_url={settings.worker_ledger_url}",)
            engine_url = f"http://{gateway.engine_host}:{gateway.engine_port}"
            self.engine = ManagedProcess(
                name="Engine",
                command=(
                    *python,
                    "engine",
                    "serve",
                    "--model",
                    gateway.model,
                    "--host",
                    gateway.engine_host,
                    "--port",
                    str(gateway.engine_port),
                    *common,
                    *ledger_urls,
                ),
                data_dir=self.data_dir,
                host=gateway.engine_host,
                ports=((gateway.engine_port, "services.gateway.engine_port"),),
            )
            self.gateway = ManagedProcess(
                name="Gateway",
                command=(
                    *python,
                    "gateway",
                    "--model",
                    gateway.model,
                    "--engine-url",
                    engine_url,
                    "--host",
                    gateway.host,
                    "--port",
                    str(gateway.port),
                    "--max-context",
                    str(gateway.max_context),
                    *common,
                    *ledger_urls,
                    # The operator routes' run control (pause, resume, max_lag) goes to the run's workflow.
                    f"services.temporal.address={settings.temporal_address}",
                ),
                data_dir=self.data_dir,
                host=gateway.host,
                ports=((gateway.port, "services.gateway.port"),),
            )
            # A runner plays episodes through this gateway; it listens on no port (it polls Temporal).
            runner_path = _runner_import_path(self.data_dir, import_path)
            self.runner = ManagedProcess(
                name="Runner",
                command=(
                    *python,
                    "worker",
                    "runner",
                    "--gateway-url",
                    f"http://{gateway.host}:{gateway.port}",
                    *common,
                    *ledger_urls,
                    f"services.temporal.address={settings.temporal_address}",
                ),
                data_dir=self.data_dir,
                host=gateway.host,
                ports=(),
                env=(("PYTHONPATH", os.pathsep.join(runner_path)),),
            )
            # The trainer is started by `rollout train` (`start_trainer`), with the `trainer.*` settings it got.
            self.trainer = ManagedProcess(
                name="Trainer",
                command=(
                    *python,
                    "worker",
                    "trainer",
                    *common,
                    *ledger_urls,
                    f"services.temporal.address={settings.temporal_address}",
                    *trainer_overrides(settings),
                ),
                data_dir=self.data_dir,
                host=gateway.host,
                ports=(),
            )
        self.temporal = (
            None
            if services.temporal.address
            else EmbeddedTemporal(
                data_dir=self.data_dir,
                host=services.temporal.host,
                port=services.temporal.port,
                ui_port=services.temporal.ui_port,
                namespace=services.temporal.namespace,
            )
        )

    def _check_data_dir(self) -> None:
        if self.data_dir.exists() and not self.data_dir.is_dir():
            raise CorruptDataDirError(
                f"data_dir {self.data_dir} is a file, not a directory. Nothing was changed: move it aside or set "
                "`data_dir=` (or ROLLOUT_DATA_DIR) to another path."
            )

    @contextmanager
    def _lock(self) -> Iterator[None]:
        lock_path = self.data_dir / "run" / "stack.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def up(self, report: Callable[[str], None] = lambda _: None) -> list[ServiceStatus]:
        """Start every embedded service that is not running, migrate the ledger, return the status."""
        self._check_data_dir()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if self.postgres is not None:
                report("Postgres: starting" if self.postgres.pid() is None else "Postgres: already running")
                self.postgres.start()
            report("ledger: migrating to the newest schema")
            migrate.upgrade(self.settings.ledger_url)
            if self.temporal is not None:
                report("Temporal: starting" if self.temporal.pid() is None else "Temporal: already running")
                self.temporal.start()
                # Open ports are not readiness: the frontend answers health checks a little later.
                report("Temporal: waiting until it answers")
                self._wait_until_healthy(self._temporal_status, timeout_s=90)
            if self.engine is not None and self.gateway is not None:
                # The first start converts the model once (about a minute for SmolLM2 on a laptop CPU).
                report("engine: starting" if self.engine.pid() is None else "engine: already running")
                self.engine.start(timeout_s=600)
                report("gateway: starting" if self.gateway.pid() is None else "gateway: already running")
                self.gateway.start(timeout_s=120)
            if self.runner is not None:
                if self.runner.pid() is not None and self.runner.started_env() != dict(self.runner.env):
                    # Environments this caller imports would not load on it: restart it with the wider path (its
                    # episodes in flight are retried by Temporal on the new runner).
                    report("runner: restarting to import environments from here")
                    self.runner.stop()
                report("runner: starting" if self.runner.pid() is None else "runner: already running")
                if self.runner.start():
                    self._check_stays_up(self.runner)
            open_store(
                self.settings.blob_url,
                s3_endpoint=self.settings.services.blobs.s3_endpoint,
                s3_secure=self.settings.services.blobs.s3_secure,
            )
        return self.status()

    def start_trainer(self, *, restart: bool = True) -> None:
        """Start the trainer worker with these settings (restarting one that runs with others: a step it was
        training is retried by Temporal on the same batch, from the last published checkpoint)."""
        if self.trainer is None:
            raise RuntimeError(
                "the embedded stack runs no gateway (services.gateway.enabled=false): no trainer"
            )
        with self._lock():
            if restart:
                self.trainer.stop()
            if self.trainer.start():
                self._check_stays_up(self.trainer)

    @staticmethod
    def _wait_until_healthy(check: Callable[[], ServiceStatus], timeout_s: float) -> ServiceStatus:
        deadline = time.monotonic() + timeout_s
        while True:
            status = check()
            if status.healthy or time.monotonic() > deadline:
                return status
            time.sleep(0.5)

    def down(self, report: Callable[[str], None] = lambda _: None) -> list[str]:
        """Stop the embedded services; return the names of those that were running."""
        stopped: list[str] = []
        if not self.data_dir.is_dir():
            return stopped
        with self._lock():
            for process in (self.trainer, self.runner, self.gateway, self.engine):
                if process is not None and process.pid() is not None:
                    report(f"{process.name}: stopping")
                    process.stop()
                    stopped.append(process.name.lower())
            if self.temporal is not None and self.temporal.pid() is not None:
                report("Temporal: stopping")
                self.temporal.stop()
                stopped.append("temporal")
            if self.postgres is not None and self.postgres.pid() is not None:
                report("Postgres: stopping")
                self.postgres.stop()
                stopped.append("postgres")
        return stopped

    def status(self) -> list[ServiceStatus]:
        services = [self._postgres_status(), self._temporal_status(), self._blobs_status()]
        gateway = self.settings.services.gateway
        if self.engine is not None and self.gateway is not None:
            engine_url = f"http://{gateway.engine_host}:{gateway.engine_port}"
            services.append(self._http_status("engine", self.engine, engine_url, _engine_serves(engine_url)))
            services.append(
                self._http_status(
                    "gateway",
                    self.gateway,
                    f"http://{gateway.host}:{gateway.port}",
                    "agents use /s/TOKEN/v1 (`rollout seat new`)",
                )
            )
        if self.runner is not None:
            pid = self.runner.pid()
            services.append(
                ServiceStatus(
                    name="runner",
                    mode="embedded",
                    address=f"queue {RUNNER_QUEUE}",
                    healthy=pid is not None,
                    detail="plays episodes (`rollout run start ENV`)" if pid else "not running",
                    pid=pid,
                )
            )
        if self.trainer is not None and (pid := self.trainer.pid()) is not None:
            services.append(
                ServiceStatus(
                    name="trainer",
                    mode="embedded",
                    address=f"queue {TRAINER_QUEUE}",
                    healthy=True,
                    detail=f"trains {self.settings.trainer.model} (`rollout train`)",
                    pid=pid,
                )
            )
        return services

    @staticmethod
    def _check_stays_up(process: ManagedProcess, settle_s: float = 5.0) -> None:
        """A process with no port is ready when it has not died on start (a bad setting, an unreachable service)."""
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            if process.pid() is None:
                tail = (
                    process.log_path.read_text(errors="replace")[-2000:] if process.log_path.exists() else ""
                )
                raise RuntimeError(f"{process.name} exited as it started:\n{tail}")
            time.sleep(0.25)

    def _http_status(self, name: str, process: ManagedProcess, url: str, detail: str) -> ServiceStatus:
        try:
            healthy = httpx.get(f"{url}/health", timeout=3).status_code == 200
        except httpx.HTTPError as error:
            healthy, detail = False, f"unreachable: {type(error).__name__}"
        return ServiceStatus(
            name=name, mode="embedded", address=url, healthy=healthy, detail=detail, pid=process.pid()
        )

    def _postgres_status(self) -> ServiceStatus:
        url = self.settings.ledger_url
        pid = self.postgres.pid() if self.postgres else None
        mode: Mode = "embedded" if self.postgres else "external"
        try:
            with psycopg.connect(url, connect_timeout=3) as conn:
                version = conn.execute("SHOW server_version").fetchone()
                revision = conn.execute(
                    "SELECT version_num FROM alembic_version"
                    " WHERE EXISTS (SELECT 1 FROM pg_tables WHERE tablename = 'alembic_version')"
                ).fetchone()
            schema = f"schema {revision[0]}" if revision else "schema not migrated (run `rollout up`)"
            detail = f"PostgreSQL {version[0] if version else '?'}, {schema}"
            return ServiceStatus(
                name="postgres",
                mode=mode,
                address=redact(url),
                healthy=revision is not None,
                detail=detail,
                pid=pid,
            )
        except psycopg.Error as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return ServiceStatus(
                name="postgres",
                mode=mode,
                address=redact(url),
                healthy=False,
                detail=f"unreachable: {reason}",
                pid=pid,
            )

    def _temporal_status(self) -> ServiceStatus:
        address, ui_url = self.settings.temporal_address, self.settings.temporal_ui_url
        pid = self.temporal.pid() if self.temporal else None
        mode: Mode = "embedded" if self.temporal else "external"
        ok, detail = asyncio.run(_check_temporal(address, self.settings.services.temporal.namespace))
        if ok and ui_url:
            try:
                ui_ok = httpx.get(ui_url, timeout=3).status_code < 500
            except httpx.HTTPError as error:
                ui_ok, detail = False, f"web UI unreachable at {ui_url}: {error}"
            if not ui_ok:
                ok = False
        return ServiceStatus(
            name="temporal", mode=mode, address=address, healthy=ok, detail=detail, pid=pid, ui_url=ui_url
        )

    def _blobs_status(self) -> ServiceStatus:
        url = self.settings.blob_url
        if url.startswith("file://"):
            root = Path(url.removeprefix("file://"))
            healthy = root.is_dir() and os.access(root, os.W_OK)
            detail = "writable directory" if healthy else "missing or not writable (run `rollout up`)"
            return ServiceStatus(name="blobs", mode="embedded", address=url, healthy=healthy, detail=detail)
        try:
            store = open_store(
                url,
                s3_endpoint=self.settings.services.blobs.s3_endpoint,
                s3_secure=self.settings.services.blobs.s3_secure,
            )
            store.exists("__health__")
            return ServiceStatus(
                name="blobs", mode="external", address=url, healthy=True, detail="bucket reachable"
            )
        except Exception as error:  # any client or network failure is an unhealthy store, reported as such
            return ServiceStatus(
                name="blobs", mode="external", address=url, healthy=False, detail=f"unreachable: {error}"
            )


def _engine_serves(url: str) -> str:
    """What an engine really serves, from its own /v1/models: the base model's folder and the checkpoints loaded."""
    try:
        models = httpx.get(f"{url}/v1/models", timeout=3).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return "not answering /v1/models"
    bases = sorted({Path(str(m.get("root", m["id"]))).name for m in models if m.get("parent") is None})
    loaded = [str(m["id"]) for m in models if m.get("parent") is not None]
    more = f" + {len(loaded)} checkpoint(s): {', '.join(loaded[:3])}{' …' if len(loaded) > 3 else ''}"
    return f"serving {', '.join(bases) or '?'}{more if loaded else ''}"


def _runner_import_path(data_dir: Path, wanted: list[str] | None) -> list[str]:
    """What the runner is started with: the running runner's import path, then any new entries of `wanted`."""
    from rollout.references import import_path

    recorded = ManagedProcess(name="Runner", command=(), data_dir=data_dir, host="", ports=()).started_env()
    running = [entry for entry in recorded.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return list(dict.fromkeys([*running, *(import_path() if wanted is None else wanted)]))


def trainer_overrides(settings: Settings) -> list[str]:
    """The `trainer.*` settings as command-line overrides, so a trainer process trains what was asked."""
    from dataclasses import fields

    out: list[str] = []
    for spec in fields(settings.trainer):
        value = getattr(settings.trainer, spec.name)
        text = "null" if value is None else str(value.value if hasattr(value, "value") else value)
        out.append(f"trainer.{spec.name}={text}")
    return out


async def _check_temporal(address: str, namespace: str) -> tuple[bool, str]:
    from temporalio.client import Client

    try:
        async with asyncio.timeout(5):
            client = await Client.connect(address, namespace=namespace)
            healthy = await client.service_client.check_health()
    except Exception as error:  # connection refused, timeout, TLS: all mean "not reachable"
        text = str(error).strip() or type(error).__name__
        return (
            False,
            "unreachable: connection refused" if "ConnectionRefused" in text else f"unreachable: {text}",
        )
    return healthy, f"namespace {namespace}" if healthy else "health check failed"
