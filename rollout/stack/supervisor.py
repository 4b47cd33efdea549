"""The embedded stack's supervisor: one detached process that starts the stack's services and restarts any
that dies, with backoff, recording what it did.

Contract:
- What to keep running is the ordered list of `ServiceSpec` in `run/supervised.json`, written under the
  stack's lock by `Stack.up` and `Stack.start_trainer` (`want`) and emptied by `Stack.down` (`unwant_all`).
  The supervisor reads it on every tick; it never writes it.
- Every tick (`TICK_S`) it reaps its exited children (it is a child subreaper, so Postgres's postmaster,
  forked behind `pg_ctl`, is its child too) and records each one's exit: an exit code, or the signal that
  killed it.
- A wanted service that is not running is started when the foundations listed before it run (the list is in
  dependency order: Postgres, then Temporal, then the services that need only those two: engine, gateway,
  runner, trainer, dashboard, sandboxes, which start together) and its backoff has passed: 1 s after the first
  failure, doubling to `MAX_BACKOFF_S`; a service that stayed up `HEALTHY_AFTER_S` starts again from 1 s. A
  service whose ports do not accept connections within its start timeout is killed and counted a failure.
- A running service whose spec changed (a runner's import path, a trainer's settings) is stopped and started
  with the new one; a service no longer wanted is left alone (`down` stops it).
- What it knows is in `run/supervisor.json` (`read_state`): per service its state (`starting`, `running`,
  `backoff`), pid, restarts, last exit and last error; restart counts survive a restart of the supervisor,
  which adopts the services that still run. Each action is also a line in `logs/supervisor.log`.
- SIGTERM stops the supervisor and nothing else: the services keep running until `down` stops them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rollout.stack.managed import ManagedProcess
from rollout.stack.postgres import EmbeddedPostgres
from rollout.stack.processes import PortTakenError, terminate

TICK_S = 0.5
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0
PR_SET_CHILD_SUBREAPER = 36
FOUNDATIONS = ("Postgres", "Temporal")  # every other service needs these, and only these, to start

State = Literal["starting", "running", "backoff"]


@dataclass(frozen=True)
class ServiceSpec:
    """How to run one service. `kind="postgres"` is the embedded Postgres of `data_dir` on `host:port`; every
    other service is a `ManagedProcess` running `command` with `env` on top of the supervisor's
    environment."""

    name: str
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    host: str = "127.0.0.1"
    ports: tuple[tuple[int, str], ...] = ()
    start_timeout_s: float = 60.0
    kind: Literal["process", "postgres"] = "process"

    @staticmethod
    def of(process: ManagedProcess, start_timeout_s: float) -> ServiceSpec:
        return ServiceSpec(
            name=process.name,
            command=process.command,
            env=process.env,
            host=process.host,
            ports=process.ports,
            start_timeout_s=start_timeout_s,
        )

    @staticmethod
    def postgres(postgres: EmbeddedPostgres) -> ServiceSpec:
        return ServiceSpec(
            name="Postgres",
            host=postgres.host,
            ports=((postgres.port, "services.postgres.port"),),
            kind="postgres",
        )

    def as_json(self) -> dict[str, Any]:
        """Plain JSON values (lists, not tuples), so a spec read back from a file compares equal to this
        one."""
        return json.loads(json.dumps(asdict(self)))

    @staticmethod
    def from_json(data: dict[str, Any]) -> ServiceSpec:
        return ServiceSpec(
            name=data["name"],
            command=tuple(data["command"]),
            env=tuple((str(k), str(v)) for k, v in data["env"]),
            host=data["host"],
            ports=tuple((int(port), str(setting)) for port, setting in data["ports"]),
            start_timeout_s=float(data["start_timeout_s"]),
            kind=data["kind"],
        )


@dataclass
class ServiceState:
    """What the supervisor knows of one service (a row of `run/supervisor.json`)."""

    state: State = "starting"
    pid: int | None = None
    restarts: int = 0  # starts after it died (a restart for new settings is not counted)
    starts: int = 0
    last_exit: str | None = None  # "killed by SIGKILL", "exit 1", "did not come up within 60s"
    last_exit_at: float | None = None
    last_error: str | None = None  # why the last start failed, for `up` to report
    last_error_at: float | None = None
    started_at: float | None = None  # when its last start began
    spec: dict[str, Any] = field(default_factory=dict)  # the spec it was started with

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def supervised_path(data_dir: Path) -> Path:
    return data_dir / "run" / "supervised.json"


def state_path(data_dir: Path) -> Path:
    return data_dir / "run" / "supervisor.json"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def wanted(data_dir: Path) -> list[ServiceSpec]:
    try:
        return [ServiceSpec.from_json(item) for item in json.loads(supervised_path(data_dir).read_text())]
    except (FileNotFoundError, ValueError):
        return []


def want(data_dir: Path, spec: ServiceSpec) -> None:
    """Add `spec` to what is kept running, or replace the spec of that name (call under the stack's lock)."""
    specs = [s for s in wanted(data_dir) if s.name != spec.name]
    order = ["Postgres", "Temporal", "Engine", "Gateway", "Runner", "Trainer"]
    specs.append(spec)
    specs.sort(key=lambda s: order.index(s.name) if s.name in order else len(order))
    _write_json(supervised_path(data_dir), [s.as_json() for s in specs])


def unwant(data_dir: Path, name: str) -> None:
    _write_json(supervised_path(data_dir), [s.as_json() for s in wanted(data_dir) if s.name != name])


def unwant_all(data_dir: Path) -> None:
    supervised_path(data_dir).unlink(missing_ok=True)


def read_state(data_dir: Path) -> dict[str, ServiceState]:
    try:
        rows = json.loads(state_path(data_dir).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {name: ServiceState(**row) for name, row in rows.items()}


def supervisor_process(data_dir: Path) -> ManagedProcess:
    return ManagedProcess(
        name="Supervisor",
        command=(sys.executable, "-m", "rollout.stack.supervisor", str(data_dir)),
        data_dir=data_dir,
        host="127.0.0.1",
        ports=(),
    )


def process_of(data_dir: Path, spec: ServiceSpec) -> ManagedProcess:
    return ManagedProcess(
        name=spec.name,
        command=spec.command,
        data_dir=data_dir,
        host=spec.host,
        ports=spec.ports,
        env=spec.env,
    )


def running_pid(data_dir: Path, spec: ServiceSpec) -> int | None:
    """The pid of the live process running `spec`'s service, if there is one."""
    if spec.kind == "postgres":
        return EmbeddedPostgres(data_dir, spec.host, spec.ports[0][0]).pid()
    return process_of(data_dir, spec).pid()


def failed_since(state: ServiceState, asked: float) -> bool:
    """Whether a start the supervisor began after `asked` has failed (the end of an older process is not)."""
    return (
        state.started_at is not None
        and state.started_at >= asked
        and state.last_exit_at is not None
        and state.last_exit_at >= state.started_at
    )


def runs_as_wanted(data_dir: Path, spec: ServiceSpec, state: ServiceState | None) -> bool:
    """Whether the supervisor runs `spec` as asked, and its process is alive (the supervisor may be a tick
    behind a process that just died)."""
    return (
        state is not None
        and state.state == "running"
        and state.spec == spec.as_json()
        and state.pid is not None
        and running_pid(data_dir, spec) == state.pid
    )


def describe_exit(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


class Supervisor:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.states = read_state(data_dir)
        self.exits: dict[int, int] = {}  # reaped pid -> wait status
        self.children: list[Any] = []  # Popen objects, kept so `subprocess` never reaps them behind our back
        self.next_try: dict[str, float] = {}
        self.backoff: dict[str, float] = {}
        self.deadline: dict[str, float] = {}
        self.asked_to_restart: set[str] = set()
        self.log = (data_dir / "logs" / "supervisor.log").open("a", buffering=1)
        self.stopping = False

    def say(self, line: str) -> None:
        self.log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")

    def run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        self.say(f"supervisor {os.getpid()} watching {supervised_path(self.data_dir)}")
        while not self.stopping:
            self.tick()
            time.sleep(TICK_S)
        self.say("supervisor stopping (the services keep running)")

    def tick(self) -> None:
        self._reap()
        blocked = False
        for spec in wanted(self.data_dir):
            state = self.states.setdefault(spec.name, ServiceState())
            self._watch(spec, state)
            if not blocked and state.state != "running":
                self._maybe_start(spec, state)
            blocked = blocked or (spec.name in FOUNDATIONS and state.state != "running")
        _write_json(state_path(self.data_dir), {name: s.as_json() for name, s in self.states.items()})

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.exits[pid] = status

    def _await_exit(self, pid: int, within_s: float = 5.0) -> None:
        """Wait a little for our child `pid` to become reapable. A multi-threaded process (Temporal is Go)
        shows as a zombie while its other threads still exit, and cannot be reaped until they have."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                reaped, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return  # not our child (adopted from an earlier supervisor), or reaped already
            if reaped == pid:
                self.exits[pid] = status
                return
            time.sleep(0.05)

    def _pid(self, spec: ServiceSpec) -> int | None:
        return running_pid(self.data_dir, spec)

    def _process(self, spec: ServiceSpec) -> ManagedProcess:
        return process_of(self.data_dir, spec)

    def _postgres(self, spec: ServiceSpec) -> EmbeddedPostgres:
        return EmbeddedPostgres(self.data_dir, spec.host, spec.ports[0][0])

    def _watch(self, spec: ServiceSpec, state: ServiceState) -> None:
        """Bring `state` up to date with the process: adopted, ready, exited, or started with another spec."""
        pid = self._pid(spec)
        now = time.time()
        if pid is not None and state.pid != pid and state.state != "starting":
            state.pid, state.state, state.started_at = pid, "running", now  # adopted: it ran before we did
            state.spec = state.spec or spec.as_json()
            self.say(f"{spec.name}: adopted pid {pid}")
        if pid is not None and state.spec and state.spec != spec.as_json():
            self.say(f"{spec.name}: its settings changed; restarting it")
            self._stop(spec)
            state.state, state.pid, state.spec = "backoff", None, {}
            self.next_try[spec.name] = 0.0
            self.asked_to_restart.add(spec.name)  # not a failure: it does not count as a restart
            return
        if state.state == "starting" and state.pid is not None:
            if pid is None:
                self._failed(spec, state, self._exit_of(state.pid, "exited while starting"))
            elif self._process(spec).ports_ready():
                state.state = "running"
                self.say(f"{spec.name}: running (pid {pid})")
            elif now > self.deadline.get(spec.name, now):
                self._stop(spec)
                self._failed(spec, state, f"did not come up within {spec.start_timeout_s:.0f}s")
        elif state.state == "running" and pid is None:
            self._failed(spec, state, self._exit_of(state.pid, "exited"))
        if state.state == "running" and state.started_at and now - state.started_at > HEALTHY_AFTER_S:
            self.backoff.pop(spec.name, None)

    def _exit_of(self, pid: int | None, otherwise: str) -> str:
        self._reap()
        if pid is not None and pid not in self.exits:
            self._await_exit(pid)
        status = self.exits.pop(pid, None) if pid is not None else None
        return describe_exit(status) if status is not None else f"{otherwise} (status unknown: not our child)"

    def _failed(self, spec: ServiceSpec, state: ServiceState, why: str) -> None:
        delay = self.backoff.get(spec.name, FIRST_BACKOFF_S / 2) * 2
        self.backoff[spec.name] = min(delay, MAX_BACKOFF_S)
        self.next_try[spec.name] = time.monotonic() + self.backoff[spec.name]
        state.state, state.pid = "backoff", None
        state.last_exit, state.last_exit_at = why, time.time()
        self.say(f"{spec.name}: {why}; next start in {self.backoff[spec.name]:.0f}s")

    def _maybe_start(self, spec: ServiceSpec, state: ServiceState) -> None:
        if state.state == "starting" and state.pid is not None:
            return
        if time.monotonic() < self.next_try.get(spec.name, 0.0):
            return
        if state.starts > 0 and spec.name not in self.asked_to_restart:
            state.restarts += 1
        self.asked_to_restart.discard(spec.name)
        state.starts += 1
        state.started_at = time.time()
        self.say(f"{spec.name}: starting (start {state.starts})")
        try:
            if spec.kind == "postgres":
                self._postgres(spec).start(timeout_s=spec.start_timeout_s)
                pid = self._pid(spec)
                state.state = "running" if pid is not None else "starting"
            else:
                child = self._process(spec).launch()
                self.children.append(child)
                pid = child.pid
                self.deadline[spec.name] = time.time() + spec.start_timeout_s
                state.state = "starting"
        except (PortTakenError, RuntimeError, OSError) as error:
            state.last_error, state.last_error_at = str(error), time.time()
            self._failed(spec, state, f"could not start: {str(error).splitlines()[0]}")
            return
        state.pid, state.spec = pid, spec.as_json()
        state.last_error = None
        if state.state == "running":
            self.say(f"{spec.name}: running (pid {pid})")

    def _stop(self, spec: ServiceSpec) -> None:
        if spec.kind == "postgres":
            self._postgres(spec).stop()
            return
        pid = self._process(spec).pid()
        if pid is not None:
            terminate(pid)
            self._reap()
        self._process(spec).pid_path.unlink(missing_ok=True)


if __name__ == "__main__":
    Supervisor(Path(sys.argv[1])).run()
