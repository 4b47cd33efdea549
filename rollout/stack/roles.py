"""The embedded stack's services as roles: one definition each of what runs, what it is told, and how
`rollout status` shows it.

Contract:
- A `Role` is one service the supervisor keeps running: its name, the `rollout` command it runs, the settings
  sections it reads beyond the stack's addresses, the settings naming where it listens, how long it may take
  to become ready, and its status line. `Role.process(settings, import_path)` is its `ManagedProcess`.
- Every command a role runs reads its options from the settings (`rollout engine serve`, `gateway`, `worker
  runner`, `worker trainer` and `monitor` default each option to its setting), so a role's command line is
  its command and `service_overrides(settings, …)`, the typed settings written out one `key=value` per
  field (`rollout.config.overrides`), which the process loads back as they were: nothing here spells a
  command's flag. A role is told only the sections (or single settings) it reads: a change to any other
  leaves its command line, so its running process, as it was.
- Every role is given the stack's addresses (`STACK_SECTIONS`): data and model directories, log level,
  Temporal, the gateway and engine, the sandbox isolation, and the ledger's service logins (each writer
  kind's own, `rollout.config.LedgerWriter`, which the process picks by what it is; the worker's, reader's
  and sandbox hosts'); never the owner's URL. No password is on the command line: the process gets them in a
  password file (`PGPASSFILE`, rollout.stack.ledger_password).
- `ROLES` lists them in the order `up` starts them (`down` stops them in reverse). The trainer (and
  the sandboxes, `rollout.stack.sandboxes`) run `on_demand`: started for `rollout train`, kept by `up` once
  asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

from rollout.config import EngineKind, LedgerWriter, Settings
from rollout.config.overrides import overrides_for, setting_at, setting_given
from rollout.security.isolation import said
from rollout.serving.keys import known_engine_api_key
from rollout.stack.health import ServiceStatus, engine_opponents, engine_serves, engine_status, http_status
from rollout.stack.ledger_password import passfile_for, password_out_of
from rollout.stack.managed import ManagedProcess
from rollout.workflows.names import RUNNER_QUEUE, TRAINER_QUEUE

# What every service is told: where the stack's parts are, and how agents' commands are confined.
STACK_SECTIONS = (
    "data_dir",
    "models_dir",
    "log_level",
    "services.postgres",
    "services.temporal",
    "services.gateway",
    "sandbox",
)

_OPTION = "--"


def service_overrides(settings: Settings, *sections: str) -> list[str]:
    """`sections` of `settings` as a service is told them (`rollout.config.overrides`); the ledger section
    is the services' view of it: the service logins' URLs (`Settings.service_ledger_urls`), never the
    owner's."""
    given = settings.services.postgres
    # A server of the user's own: the URLs services connect with (its worker's, else the one given). The
    # embedded one: none, as they make each role's URL from its host and port.
    own = bool(given.url or given.worker_url)
    postgres = replace(
        given,
        url=None,
        worker_url=_without_password(settings.worker_ledger_url) if own else None,
        reader_url=_without_password(settings.reader_ledger_url) if own else None,
        sandbox_url=_without_password(settings.sandbox_ledger_url) if own else None,
        **{
            f"{writer.value}_url": _without_password(settings.writer_ledger_url(writer)) if own else None
            for writer in LedgerWriter
        },
    )
    told = replace(settings, services=replace(settings.services, postgres=postgres))
    return overrides_for(told, *sections)


def _without_password(url: str) -> str:
    # Its password goes in a file (`Role.process`), never on a command line.
    return password_out_of(url)[0]


Status = Callable[[Settings, int | None, tuple[str, ...]], ServiceStatus]


@dataclass(frozen=True)
class Role:
    """One service of the embedded stack."""

    name: str  # the supervisor's name for it (its pid and log files are the name in lower case)
    command: tuple[str, ...]  # the `rollout` command it runs, with any arguments of its own
    status: Status  # its line in `rollout status`: (settings, pid, the command it runs with) → status
    reads: tuple[str, ...] = ()  # settings sections it reads beyond STACK_SECTIONS
    listens: tuple[str, str] | None = None  # the settings naming its host and port; None: it listens on none
    ready_s: Callable[[Settings], float] = lambda _: 60.0  # how long it may take to start
    enabled: Callable[[Settings], bool] = lambda settings: settings.services.gateway.enabled
    imports_environments: bool = False  # it is given the stack's import path as $PYTHONPATH
    on_demand: bool = False  # started for `rollout train`; `up` keeps it only once asked for

    def process(self, settings: Settings, import_path: list[str]) -> ManagedProcess:
        host, port = (setting_at(settings, s) for s in self.listens) if self.listens else ("127.0.0.1", None)
        passfile = passfile_for(settings.data_path, *settings.service_ledger_urls)
        return ManagedProcess(
            name=self.name,
            command=(
                sys.executable,
                "-m",
                "rollout.cli",
                *self.command,
                *service_overrides(settings, *STACK_SECTIONS, *self.reads),
            ),
            data_dir=settings.data_path,
            host=host,
            ports=((port, self.listens[1]),) if self.listens and port is not None else (),
            env=(
                *((("PYTHONPATH", os.pathsep.join(import_path)),) if self.imports_environments else ()),
                *((("PGPASSFILE", str(passfile)),) if passfile else ()),
            ),
        )


def _engine_url(settings: Settings) -> str:
    gateway = settings.services.gateway
    return f"http://{gateway.engine_host}:{gateway.engine_port}"


def _engine_status(settings: Settings, pid: int | None, _: tuple[str, ...]) -> ServiceStatus:
    url = _engine_url(settings)
    key = known_engine_api_key(settings.data_path)
    # Replicas (rollout.stack.replicas) are told apart by their ports.
    name = (
        "engine"
        if settings.services.engine.replicas == 1
        else f"engine:{settings.services.gateway.engine_port}"
    )
    return engine_status(name, pid, url, engine_serves(url, key) + engine_opponents(settings, url), key)


def _gateway_status(settings: Settings, pid: int | None, _: tuple[str, ...]) -> ServiceStatus:
    gateway = settings.services.gateway
    url = f"http://{gateway.host}:{gateway.port}"
    return http_status("gateway", pid, url, "agents use /s/TOKEN/v1 (`rollout seat new`)")


def _runner_status(settings: Settings, pid: int | None, _: tuple[str, ...]) -> ServiceStatus:
    detail = f"plays episodes (`rollout run start ENV`); {said(settings.sandbox.isolation)}"
    return ServiceStatus(
        name="runner",
        mode="embedded",
        address=f"queue {RUNNER_QUEUE}",
        healthy=pid is not None,
        detail=detail if pid else "not running",
        pid=pid,
    )


def _trainer_status(settings: Settings, pid: int | None, command: tuple[str, ...]) -> ServiceStatus:
    # The model the running trainer was started to train: a run's recorded settings, which may not be these.
    model = setting_given(command, "trainer.model") or settings.trainer.model
    return ServiceStatus(
        name="trainer",
        mode="embedded",
        address=f"queue {TRAINER_QUEUE}",
        healthy=pid is not None,
        detail=f"trains {model} (`rollout train`)" if pid else "not running",
        pid=pid,
    )


def _monitor_status(settings: Settings, pid: int | None, _: tuple[str, ...]) -> ServiceStatus:
    monitor = settings.services.monitor
    return http_status(
        "monitor",
        pid,
        f"http://{monitor.host}:{monitor.port}",
        "the dashboard: runs, transcripts, checkpoints, evals, machines (`rollout monitor`)",
        health="/_stcore/health",
    )


# The first start converts the model once (about a minute for SmolLM2 on a laptop CPU); vLLM loading a large
# model and capturing its CUDA graphs can take many minutes.
ENGINE = Role(
    name="Engine",
    command=("engine", "serve"),
    status=_engine_status,
    # Its kind (auto follows the trainer's provider), Tinker's model, the GPU lease it gives way to: only the
    # trainer's settings it reads, so a run that trains other steps or rates does not restart (and reload) it.
    reads=(
        "services.engine",
        "trainer.provider",
        "trainer.tinker_base_model",
        "trainer.tinker_url",
        "trainer.gpu_lease",
        "gpu",
    ),
    listens=("services.gateway.engine_host", "services.gateway.engine_port"),
    ready_s=lambda settings: 1800.0 if settings.engine_kind == EngineKind.vllm else 600.0,
)
GATEWAY = Role(
    name="Gateway",
    command=("gateway",),
    status=_gateway_status,
    reads=("routing",),
    listens=("services.gateway.host", "services.gateway.port"),
    ready_s=lambda _: 120.0,
)
# A runner plays episodes through the gateway; it listens on no port (it polls Temporal). A runner started
# with a narrower import path is restarted with a wider one (Temporal retries its episodes on the new one).
RUNNER = Role(name="Runner", command=("worker", "runner"), status=_runner_status, imports_environments=True)
TRAINER = Role(
    name="Trainer",
    command=("worker", "trainer"),
    status=_trainer_status,
    reads=("trainer", "gpu"),
    ready_s=lambda _: 120.0,
    on_demand=True,
)
MONITOR = Role(
    name="Monitor",
    command=("monitor",),
    status=_monitor_status,
    reads=("services.monitor",),
    listens=("services.monitor.host", "services.monitor.port"),
    enabled=lambda settings: settings.services.monitor.enabled,
)
ROLES = (ENGINE, GATEWAY, RUNNER, MONITOR, TRAINER)


def arguments(**given: object) -> tuple[str, ...]:
    """A command's own options (`--name value`) from keyword arguments named as its parameters are."""
    return tuple(
        part for name, value in given.items() for part in (_OPTION + name.replace("_", "-"), str(value))
    )


def arguments_given(command: tuple[str, ...]) -> dict[str, str]:
    """The options `command` was given (`arguments`' inverse): parameter name → value."""
    return {
        option.removeprefix(_OPTION).replace("-", "_"): command[index + 1]
        for index, option in enumerate(command[:-1])
        if option.startswith(_OPTION)
    }
