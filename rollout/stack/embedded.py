"""`rollout up / status / down`: start, inspect and stop what the configuration does not point elsewhere.

Contract:
- A service with a URL configured is external: `up` starts nothing for it and only checks it.
- `up` is idempotent and serialised by a lock file in the data directory: running it twice, or from two
  shells at once, leaves one of each service running. It migrates the ledger to the newest schema, waiting
  out an embedded Postgres that was killed and is being restarted (up to `LEDGER_OUTAGE_S`), and gives the
  embedded server's service roles their passwords (kept in the data directory, as the owner's is:
  `give_service_logins`). It runs
  `services.engine.replicas` engines (rollout.stack.replicas), stopping any replica beyond that number.
- `down` stops only what `up` started (embedded services, and the sandboxes and policies' engines `rollout
  train` asked for: `keep_sandboxes`, `keep_policy_engines`), and is a no-op when nothing runs. It returns
  within `DOWN_S` whatever the services are doing: each is asked to stop (SIGTERM; Postgres's fast shutdown),
  and killed once its step's deadline has passed; it says which had to be killed (`StackStopped`). Waiting
  for the stack's lock is bounded too: a command that holds it longer does not hold `down` back.
- `status` never changes anything; every service reports its address, health and a one-line detail.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from rollout.blobs import open_store
from rollout.config import SERVICE_LEDGER_ROLES, Settings
from rollout.ledger import migrate
from rollout.ledger.errors import LedgerUnreachableError
from rollout.security.keyfiles import ledger_password
from rollout.stack.engine import check_engine
from rollout.stack.health import ServiceStatus, blobs_status, postgres_status, temporal_status
from rollout.stack.managed import ManagedProcess
from rollout.stack.policy_engines import (
    is_policy_engine,
    policy_engine_port,
    policy_engine_role,
    policy_engine_settings,
    policy_engine_status,
)
from rollout.stack.postgres import CorruptDataDirError, EmbeddedPostgres
from rollout.stack.processes import stop_together
from rollout.stack.replicas import is_replica, replica_roles
from rollout.stack.roles import ENGINE, ROLES, TRAINER, Role
from rollout.stack.sandboxes import is_sandboxes, sandboxes_role, sandboxes_status
from rollout.stack.supervisor import (
    FOUNDATIONS,
    ServiceSpec,
    failed_since,
    process_of,
    read_state,
    runs_as_wanted,
    state_path,
    supervisor_process,
    unwant,
    unwant_all,
    want,
    wanted,
)
from rollout.stack.temporal import EmbeddedTemporal

LEDGER_OUTAGE_S = 120.0  # the supervisor restarts Postgres within seconds; its backoff tops out at 30 s
# A service with no port (a runner, the trainer, sandboxes) is taken to have started once it has run this long
# since the supervisor started it without dying (a bad setting or an unreachable service ends it sooner).
SETTLE_S = 5.0
# `down`'s deadlines, one per step, asked to stop then killed: the services (and their supervisor) together,
# then Temporal, then Postgres (fast shutdown, then immediate, then SIGKILL). Within DOWN_S in all.
DOWN_LOCK_WAIT_S = 2.0
DOWN_SERVICES_S = 10.0
DOWN_TEMPORAL_S = 5.0
DOWN_POSTGRES_S = 6.0
DOWN_S = 30.0


@dataclass(frozen=True)
class StackStopped:
    """What `down` stopped: the services that were running (lower-case names), and which of them had to be
    killed because they had not stopped by their deadline."""

    stopped: list[str]
    killed: list[str]


def give_service_logins(settings: Settings) -> None:
    """On the embedded Postgres, after the migrations made the services' roles: each logs in with the password
    kept in its file under the data directory (made on first use)."""
    for role in SERVICE_LEDGER_ROLES:
        migrate.set_password(settings.ledger_url, role, ledger_password(settings.data_path, role))


class Stack:
    """The embedded stack of `settings`. `import_path` is where its runner imports environments from beyond
    the installed packages (default: the caller's working directory and $PYTHONPATH, `rollout.references`); a
    runner already running keeps the entries it has and is restarted by `up` when this one adds any."""

    def __init__(self, settings: Settings, import_path: list[str] | None = None) -> None:
        self.settings = settings
        self.data_dir = settings.data_path
        services = settings.services
        self.postgres = (
            None
            if services.postgres.url
            else EmbeddedPostgres(self.data_dir, services.postgres.host, services.postgres.port)
        )
        # Where the runner, and the sandboxes, import environments from.
        self.import_path = _runner_import_path(self.data_dir, import_path) if services.gateway.enabled else []
        self.roles: dict[str, Role] = {}
        self.told: dict[str, Settings] = {}  # the settings each role runs with (a replica: its own port)
        for role in ROLES:
            if not role.enabled(settings):
                continue
            self.roles[role.name], self.told[role.name] = role, settings
            if role.name == ENGINE.name:
                for replica, told in replica_roles(settings):
                    self.roles[replica.name], self.told[replica.name] = replica, told
        self.processes = {
            name: role.process(self.told[name], self.import_path) for name, role in self.roles.items()
        }
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
    def _lock(
        self, wait_s: float | None = None, report: Callable[[str], None] = lambda _: None
    ) -> Iterator[None]:
        """The stack's lock; with `wait_s`, held by another command for longer than that, go on without it."""
        lock_path = self.data_dir / "run" / "stack.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("w") as handle:
            deadline = None if wait_s is None else time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() >= deadline:
                        report(f"another command holds the stack's lock ({lock_path}): going on without it")
                        break
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def up(self, report: Callable[[str], None] = lambda _: None) -> list[ServiceStatus]:
        """Start the supervisor and, through it, every embedded service that is not running; migrate the
        ledger; return the status. On a half-dead stack this restarts what is missing, the trainer included
        when one was started for a run."""
        self._check_data_dir()
        check_engine(self.settings)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if self.postgres is not None:
                self.postgres.ensure_cluster()  # a data directory that is not ours stops here, before anything runs
            self._ensure_supervisor(report)
            try:
                self._start_services(report)
            except BaseException:
                if not wanted(self.data_dir):
                    supervisor_process(self.data_dir).stop()  # nothing to keep: leave no process behind
                raise
        return self.status()

    def _start_services(self, report: Callable[[str], None]) -> None:
        if self.postgres is not None:
            self._keep(report, ServiceSpec.postgres(self.postgres))
        self._migrate(report)
        if self.temporal is not None:
            self.temporal.db_path.parent.mkdir(parents=True, exist_ok=True)
            self._keep(report, ServiceSpec.of(self.temporal.process, 60))
            # Open ports are not readiness: the frontend answers health checks a little later.
            report("Temporal: waiting until it answers")
            self._wait_until_healthy(self._temporal_status, timeout_s=90)
        # The rest need only Postgres and Temporal: the supervisor starts them together, with those `rollout
        # train` asked for (its trainer, its sandboxes) as it asked for them.
        asked = wanted(self.data_dir)
        together = [
            self._spec(role)
            for role in self.roles.values()
            if not role.on_demand or any(spec.name == role.name for spec in asked)
        ]
        together += [spec for spec in asked if is_sandboxes(spec.name) or is_policy_engine(spec.name)]
        for stale in [spec for spec in asked if is_replica(spec.name) and spec.name not in self.roles]:
            # Fewer replicas than before: the ones beyond stop (their acks go with them, and so their routes).
            report(
                f"{stale.name.lower()}: stopping (services.engine.replicas={self.settings.services.engine.replicas})"
            )
            unwant(self.data_dir, stale.name)
            process_of(self.data_dir, stale).stop()
        self._keep(report, *together)
        open_store(
            self.settings.blob_url,
            s3_endpoint=self.settings.services.blobs.s3_endpoint,
            s3_secure=self.settings.services.blobs.s3_secure,
        )

    def _migrate(self, report: Callable[[str], None]) -> None:
        """Bring the ledger to the newest schema; while the embedded Postgres is down (killed, and being
        restarted by the supervisor), wait for it for up to `LEDGER_OUTAGE_S`."""
        report("ledger: migrating to the newest schema")
        deadline = time.monotonic() + (LEDGER_OUTAGE_S if self.postgres is not None else 0)
        while True:
            try:
                migrate.upgrade(self.settings.ledger_url)
                if self.postgres is not None:
                    give_service_logins(self.settings)
                return
            except LedgerUnreachableError:
                if time.monotonic() > deadline:
                    raise
                report("ledger: Postgres is not answering; waiting for the supervisor to restart it")
                time.sleep(1.0)

    def _ensure_supervisor(self, report: Callable[[str], None]) -> None:
        supervisor = supervisor_process(self.data_dir)
        if supervisor.pid() is None:
            report("supervisor: starting")
            supervisor.start()

    def _keep(self, report: Callable[[str], None], *specs: ServiceSpec) -> None:
        """Have the supervisor keep each of `specs` running (it starts them together) and wait until they run;
        raise with the reason of the first that cannot start (and stop keeping that one)."""
        asked = time.time()
        was_running: dict[str, bool] = {}
        for spec in specs:
            state = read_state(self.data_dir).get(spec.name)
            label = spec.name if spec.name in ("Postgres", "Temporal") else spec.name.lower()
            was_running[spec.name] = runs_as_wanted(self.data_dir, spec, state)
            report(f"{label}: already running" if was_running[spec.name] else f"{label}: starting")
            want(self.data_dir, spec)
        for spec in specs:
            self._await_running(spec, asked=asked, was_running=was_running[spec.name])

    def _await_running(self, spec: ServiceSpec, *, asked: float, was_running: bool) -> None:
        deadline = time.monotonic() + spec.start_timeout_s + 30
        settled_at: float | None = None
        while True:
            state = read_state(self.data_dir).get(spec.name)
            if state is not None and failed_since(state, asked):
                unwant(self.data_dir, spec.name)
                log = self.data_dir / "logs" / f"{spec.name.lower()}.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                reason = state.last_error or state.last_exit
                raise RuntimeError(f"{spec.name} did not start ({reason}):\n{tail}")
            if runs_as_wanted(self.data_dir, spec, state):
                if spec.ports or was_running:
                    return
                # A process with no port is ready when it has not died on start (a bad setting, an unreachable
                # service): it has run `SETTLE_S` since the supervisor started it (while the services started
                # with it came up, say), or, at the latest, it is watched that long from here.
                settled_at = settled_at or time.monotonic() + SETTLE_S
                started_at = state.started_at if state is not None and state.started_at else time.time()
                if time.monotonic() > settled_at or time.time() - started_at >= SETTLE_S:
                    return
            if supervisor_process(self.data_dir).pid() is None:
                raise RuntimeError(
                    "the stack's supervisor is not running: see "
                    f"{self.data_dir / 'logs' / 'supervisor.log'}, then run `rollout up` again"
                )
            if time.monotonic() > deadline:
                unwant(self.data_dir, spec.name)
                raise RuntimeError(f"{spec.name} did not come up within {spec.start_timeout_s:.0f}s")
            time.sleep(0.2)

    def _spec(self, role: Role) -> ServiceSpec:
        told = self.told.get(role.name, self.settings)
        return ServiceSpec.of(role.process(told, self.import_path), role.ready_s(told))

    def process(self, name: str) -> ManagedProcess | None:
        """The process of role `name` (`Engine`, `Gateway`, `Runner`, `Monitor`, `Trainer`) as this stack
        starts it, or None when its settings run none."""
        return self.processes.get(name)

    def start_trainer(self, *, restart: bool = True) -> None:
        """Have the supervisor run the trainer worker with these settings (restarting one that runs with
        others: a step it was training is retried by Temporal on the same batch, from the last published
        checkpoint). `restart=False` keeps a trainer that already runs, whatever its settings."""
        trainer = self.processes.get(TRAINER.name)
        if trainer is None:
            raise RuntimeError(
                "the embedded stack runs no gateway (services.gateway.enabled=false): no trainer"
            )
        with self._lock():
            self._ensure_supervisor(lambda _: None)
            current = next((s for s in wanted(self.data_dir) if s.name == TRAINER.name), None)
            if not restart and current is not None and trainer.pid() is not None:
                return
            self._keep(lambda _: None, self._spec(TRAINER))

    def keep_policy_engines(self, models: list[str], report: Callable[[str], None] = lambda _: None) -> None:
        """Have the supervisor keep an engine serving each of `models` beside the stack's own
        (rollout.stack.policy_engines): what `rollout train` asks for when its policies are on base models of
        their own."""
        with self._lock():
            self._ensure_supervisor(report)
            running = [(spec.name, spec.command) for spec in wanted(self.data_dir)]
            specs = []
            for model in models:
                role = policy_engine_role(model)
                port = policy_engine_port(self.settings, model, running)
                running.append((role.name, (f"services.gateway.engine_port={port}",)))
                told = policy_engine_settings(self.settings, model, port)
                specs.append(ServiceSpec.of(role.process(told, self.import_path), role.ready_s(told)))
            self._keep(report, *specs)

    def keep_sandboxes(
        self, kind: str, *, seats: int, count: int, report: Callable[[str], None] = lambda _: None
    ) -> None:
        """Have the supervisor keep `count` sandboxes of `kind` served (rollout.stack.sandboxes): what
        `rollout train` asks for when its environment's episodes claim sandboxes. Another count of a kind
        replaces its service."""
        role = sandboxes_role(kind, seats=seats, count=count)
        with self._lock():
            self._ensure_supervisor(report)
            self._keep(report, self._spec(role))

    @staticmethod
    def _wait_until_healthy(check: Callable[[], ServiceStatus], timeout_s: float) -> ServiceStatus:
        deadline = time.monotonic() + timeout_s
        while True:
            status = check()
            if status.healthy or time.monotonic() > deadline:
                return status
            time.sleep(0.5)

    def down(self, report: Callable[[str], None] = lambda _: None) -> StackStopped:
        """Stop the supervisor and every embedded service, within `DOWN_S` whatever they are doing (see
        `StackStopped`)."""
        if not self.data_dir.is_dir():
            return StackStopped([], [])
        with self._lock(wait_s=DOWN_LOCK_WAIT_S, report=report):
            supervisor = supervisor_process(self.data_dir)
            wanted_now = wanted(self.data_dir)
            unwant_all(self.data_dir)  # first: a supervisor between two ticks starts nothing more
            services = {
                p.name: p
                for p in (
                    supervisor,
                    *(process_of(self.data_dir, s) for s in wanted_now if s.name not in FOUNDATIONS),
                    *reversed(self.processes.values()),
                )
            }
            running = {name: pid for name, p in services.items() if (pid := p.pid()) is not None}
            if running:
                report(f"stopping {', '.join(n for n in running if n != supervisor.name)}")
            killed = stop_together(running, DOWN_SERVICES_S)
            for process in services.values():
                process.pid_path.unlink(missing_ok=True)
            state_path(self.data_dir).unlink(missing_ok=True)
            stopped = [name.lower() for name in running if name != supervisor.name]
            if self.temporal is not None and (pid := self.temporal.pid()) is not None:
                report("Temporal: stopping")
                killed += stop_together({"Temporal": pid}, DOWN_TEMPORAL_S)
                self.temporal.process.pid_path.unlink(missing_ok=True)
                stopped.append("temporal")
            if self.postgres is not None and self.postgres.pid() is not None:
                report("Postgres: stopping")
                if self.postgres.halt(DOWN_POSTGRES_S):
                    killed.append("Postgres")
                stopped.append("postgres")
        return StackStopped(stopped, [name.lower() for name in killed])

    def supervised(self) -> bool:
        """Whether the stack's supervisor runs: without it, nothing brings back a service that stops (the
        stack was stopped on purpose, or never started)."""
        return supervisor_process(self.data_dir).pid() is not None

    def status(self) -> list[ServiceStatus]:
        services = self._service_status()
        kept = read_state(self.data_dir)
        names = {"Postgres": "postgres", "Temporal": "temporal"}
        for name, state in kept.items():
            for index, service in enumerate(services):
                if service.name == names.get(name, name.lower()) and service.mode == "embedded":
                    services[index] = replace(service, restarts=state.restarts, last_exit=state.last_exit)
        supervisor = supervisor_process(self.data_dir)
        if (pid := supervisor.pid()) is not None or kept or any(s.pid for s in services):
            restarts = sum(state.restarts for state in kept.values())
            services.insert(
                0,
                ServiceStatus(
                    name="supervisor",
                    mode="embedded",
                    address=str(self.data_dir / "logs" / "supervisor.log"),
                    healthy=pid is not None,
                    detail=f"restarts what dies ({restarts} restart(s) so far)"
                    if pid is not None
                    else "not running: nothing restarts a service that dies (run `rollout up`)",
                    pid=pid,
                ),
            )
        return services

    def _service_status(self) -> list[ServiceStatus]:
        postgres = self.postgres.pid() if self.postgres else None
        services = [
            postgres_status(self.settings.ledger_url, postgres, "embedded" if self.postgres else "external"),
            self._temporal_status(),
            blobs_status(self.settings),
        ]
        asked = {spec.name: spec for spec in wanted(self.data_dir)}
        for name, role in self.roles.items():
            pid = self.processes[name].pid()
            if role.on_demand and pid is None and name not in asked:
                continue  # a trainer no `rollout train` asked for
            # What it runs with: as the supervisor was asked to run it (a trainer: for a run's settings).
            command = asked[name].command if name in asked else self.processes[name].command
            services.append(role.status(self.told[name], pid, command))
        services += [
            policy_engine_status(self.settings, process_of(self.data_dir, spec).pid(), spec.command)
            for spec in asked.values()
            if is_policy_engine(spec.name)
        ]
        services += [
            sandboxes_status(self.settings, process_of(self.data_dir, spec).pid(), spec.command)
            for spec in asked.values()
            if is_sandboxes(spec.name)
        ]
        return services

    def _temporal_status(self) -> ServiceStatus:
        return temporal_status(
            self.settings.temporal_address,
            self.settings.temporal_ui_url,
            self.settings.services.temporal.namespace,
            self.temporal.pid() if self.temporal else None,
            "embedded" if self.temporal else "external",
        )


def _runner_import_path(data_dir: Path, wanted: list[str] | None) -> list[str]:
    """What the runner is started with: the running runner's import path, then any new entries of `wanted`."""
    from rollout.references import import_path

    recorded = ManagedProcess(name="Runner", command=(), data_dir=data_dir, host="", ports=()).started_env()
    running = [entry for entry in recorded.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return list(dict.fromkeys([*running, *(import_path() if wanted is None else wanted)]))
