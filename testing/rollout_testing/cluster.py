"""Rollout's services as real processes for chaos tests: a scripted or local engine, a gateway, runner and
trainer workers, sandbox servers, each started with `python -m rollout.cli` against a given ledger and
Temporal, each killable."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollout.config import Settings
from rollout.gateway.seats import load_secret
from rollout.net import free_port
from rollout.stack.processes import terminate, wait_for_port


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL, the way a machine dies: no cleanup runs."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        terminate(self.process.pid)
        self.process.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@dataclass
class Cluster:
    settings: Settings
    root: Path
    models_dir: Path
    task_queue: str
    services: list[Service] = field(default_factory=list[Service])

    def __post_init__(self) -> None:
        load_secret(self.root / "gateway.secret")  # made once here: the gateway and the runners share it

    def _overrides(self) -> list[str]:
        return [
            f"data_dir={self.root}",
            f"models_dir={self.models_dir}",
            f"services.postgres.url={self.settings.ledger_url}",
            f"services.temporal.address={self.settings.temporal_address}",
        ]

    def _start(self, name: str, *arguments: str, env: dict[str, str] | None = None) -> Service:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "rollout.cli", *arguments, *self._overrides()],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        service = Service(name, process, log)
        self.services.append(service)
        return service

    def _ready(self, service: Service, port: int, timeout_s: float = 120) -> None:
        assert wait_for_port("127.0.0.1", port, timeout_s, service.process.pid), (
            f"{service.name} did not come up:\n{service.tail()}"
        )

    def engine(self, *, think_ms: float = 0, script: str = "tests.scripts:play") -> str:
        port = free_port()
        service = self._start(
            "engine",
            "engine",
            "serve",
            "--kind",
            "scripted",
            "--script",
            script,
            "--think-ms",
            str(think_ms),
            "--model",
            "tiny-qwen3",
            "--port",
            str(port),
        )
        self._ready(service, port)
        return f"http://127.0.0.1:{port}"

    def _logged(self, service: Service, line: str, timeout_s: float = 120) -> Service:
        """A worker listens on no port: it is ready once it logs that it polls its queue."""
        deadline = time.monotonic() + timeout_s
        while line not in service.tail():
            assert service.process.poll() is None and time.monotonic() < deadline, (
                f"{service.name} did not start:\n{service.tail()}"
            )
            time.sleep(0.2)
        return service

    def local_engine(self, name: str, port: int | None = None, *, follow: bool = True) -> tuple[Service, str]:
        """The local engine (tiny-qwen3 on CPU) with its serving follower, acking as `name` (or without
        one)."""
        port = port or free_port()
        service = self._start(
            name,
            "engine",
            "serve",
            "--kind",
            "local",
            "--model",
            "tiny-qwen3",
            "--device",
            "cpu",
            "--name",
            name,
            "--port",
            str(port),
            "--follow" if follow else "--no-follow",
        )
        self._ready(service, port)
        return service, f"http://127.0.0.1:{port}"

    def vllm_engine(
        self, name: str, *arguments: str, env: dict[str, str] | None = None, timeout_s: float = 120
    ) -> tuple[Service, str]:
        """`rollout engine serve --kind vllm` (tiny-qwen3) with its follower, acking as `name`; `arguments`
        add options and settings, `env` what the process sees (a fake `vllm` first on PATH, on a machine
        without one)."""
        port = free_port()
        service = self._start(
            name,
            "engine",
            "serve",
            "--kind",
            "vllm",
            "--model",
            "tiny-qwen3",
            "--name",
            name,
            "--port",
            str(port),
            *arguments,
            env=env,
        )
        self._ready(service, port, timeout_s)
        return service, f"http://127.0.0.1:{port}"

    def follower(self, name: str, engine_url: str, *arguments: str) -> Service:
        """`rollout engine follow` beside an engine it did not start, acking as `name`."""
        service = self._start(
            f"follower-{name}", "engine", "follow", "--engine-url", engine_url, "--name", name, *arguments
        )
        return self._logged(service, "following")

    def trainer(self, name: str, task_queue: str, *overrides: str) -> Service:
        service = self._start(
            name,
            "worker",
            "trainer",
            "--task-queue",
            task_queue,
            "--holder",
            name,
            "trainer.model=tiny-qwen3",
            "trainer.device=cpu",
            "trainer.lora_rank=4",
            "trainer.learning_rate=1e-3",
            *overrides,
        )
        return self._logged(service, "trainer worker")

    def gateway(self, engine_url: str, port: int | None = None) -> str:
        port = port or free_port()
        service = self._start(
            "gateway",
            "gateway",
            "--model",
            "tiny-qwen3",
            "--engine-url",
            engine_url,
            "--port",
            str(port),
            "--max-context",
            "8192",
        )
        self._ready(service, port)
        return f"http://127.0.0.1:{port}"

    def runner(
        self, name: str, gateway_url: str, *overrides: str, max_activities: int | None = None
    ) -> Service:
        limit = ["--max-activities", str(max_activities)] if max_activities else []
        service = self._start(
            name,
            "worker",
            "runner",
            "--gateway-url",
            gateway_url,
            "--task-queue",
            self.task_queue,
            *limit,
            *overrides,
        )
        return self._logged(service, "runner worker on queue")

    def sandbox(self, kind: str, name: str, seats: int, *overrides: str) -> Service:
        port = free_port()
        service = self._start(
            f"sandbox-{name}",
            "sandbox",
            "serve",
            "--kind",
            kind,
            "--name",
            name,
            "--seats",
            str(seats),
            "--port",
            str(port),
            *overrides,
        )
        self._ready(service, port)
        return service

    def close(self) -> None:
        for service in reversed(self.services):
            if service.process.poll() is None:
                service.stop()
        self.services.clear()
