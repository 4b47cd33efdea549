"""Detached service processes tracked by pid files that survive the CLI that started them.

Contract:
- A pid file records the pid and the process's start time (in clock ticks since boot where /proc has it, so a
  jump of the wall clock does not make a live process look like another); a pid whose start time differs is a
  stale file (the pid was reused), and is treated exactly like a dead process.
- `start_detached` starts a process in its own session, so it outlives the CLI and a Ctrl-C in the terminal.
- `terminate` sends SIGTERM, waits, then SIGKILLs the whole process group; `stop_together` does the same to
  several processes at once, under one deadline, and names those it had to kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


class PortTakenError(RuntimeError):
    """A port the stack wants is held by a process that is not ours."""

    def __init__(self, service: str, host: str, port: int, setting: str) -> None:
        super().__init__(
            f"{service} cannot listen on {host}:{port}: the port is taken by another process. "
            f"Stop that process or choose another port with `{setting}=PORT`."
        )
        self.setting = setting


@dataclass(frozen=True)
class PidRecord:
    pid: int
    started_at: float
    start_ticks: int | None = (
        None  # since boot (Linux): unlike `started_at`, a jump of the wall clock moves it not
    )

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            # A pid is reused after its process dies: the start time tells the two apart.
            ticks = start_ticks(self.pid)
            if self.start_ticks is not None and ticks is not None:
                return ticks == self.start_ticks
            return abs(process.create_time() - self.started_at) < 1.0
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat), or None where there is no /proc. The
    wall clock can jump (a virtual machine restored from a snapshot, NTP): a start time read from it cannot be
    compared with one recorded before the jump, this one can."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the command name before ")" may hold spaces


def read_pid_file(path: Path) -> PidRecord | None:
    """The live process a pid file names; a missing, unreadable or stale file gives None."""
    try:
        data = json.loads(path.read_text())
        ticks = data.get("start_ticks")
        record = PidRecord(
            pid=int(data["pid"]),
            started_at=float(data["started_at"]),
            start_ticks=int(ticks) if ticks is not None else None,
        )
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return record if record.alive() else None


def write_pid_file(path: Path, pid: int) -> PidRecord:
    record = PidRecord(pid=pid, started_at=psutil.Process(pid).create_time(), start_ticks=start_ticks(pid))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"pid": record.pid, "started_at": record.started_at, "start_ticks": record.start_ticks})
    )
    tmp.replace(path)
    return record


def start_detached(
    command: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` in a new session with output appended to `log_path`. Whoever keeps the returned Popen
    decides who reaps the process; a dropped one is reaped by `subprocess` (or by init once we exit)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def terminate(pid: int, timeout_s: float = 10.0) -> bool:
    """Stop a process (and its process group, when it leads one): SIGTERM, then SIGKILL after `timeout_s`.

    A process that has exited counts as stopped even while it waits to be reaped (a zombie: its parent, or an
    init that does not reap, may keep it for good). Never raises; False when even SIGKILL left it running."""
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    with contextlib.suppress(psutil.NoSuchProcess):
        process.send_signal(signal.SIGTERM)
    if _ended(process, timeout_s):
        return True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(psutil.NoSuchProcess):
        process.kill()
    return _ended(process, timeout_s)


def stop_together(pids: dict[str, int], grace_s: float) -> list[str]:
    """Stop the processes `pids` (name → pid) together: SIGTERM to each at once, up to `grace_s` for all of
    them to end, then SIGKILL to the process group (and the process) of each still running. The names of those
    that had to be killed, in the order given. Never raises."""
    running: dict[str, psutil.Process] = {}
    for name, pid in pids.items():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process = psutil.Process(pid)
            process.send_signal(signal.SIGTERM)
            running[name] = process
    deadline = time.monotonic() + grace_s
    for name, process in list(running.items()):
        if _ended(process, max(0.0, deadline - time.monotonic())):
            del running[name]
    for process in running.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    for process in running.values():
        _ended(process, 5.0)
    return list(running)


def _ended(process: psutil.Process, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(psutil.TimeoutExpired, ChildProcessError):
            process.wait(0.1)  # reaps it when it is ours
            return True
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False


def wait_for_port(host: str, port: int, timeout_s: float, pid: int | None = None) -> bool:
    """Wait until something accepts connections on host:port; give up early if process `pid` dies."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pid is not None and not psutil.pid_exists(pid):
            return False
        if pid is not None and psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
            return True
        time.sleep(0.1)
    return False


def wait_for_http(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    """Wait until `url` answers below 500; fail early, naming the command, if `process` exits first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{process.args!r:.160} exited with {process.returncode} before {url} answered"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code < 500:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s")
