"""Pid files: a reused pid is not mistaken for our service; a service that loses its port to a race
between\nthe check and its bind is started again."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rollout.net import free_port
from rollout.stack.managed import BIND_ATTEMPTS, ManagedProcess
from rollout.stack.processes import read_pid_file, terminate, write_pid_file


def test_a_live_pid_file_names_its_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "service.pid"
    record = write_pid_file(pid_file, os.getpid())
    assert read_pid_file(pid_file) == record


def test_stale_and_reused_pids_read_as_not_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "service.pid"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_pid_file(pid_file, os.getpid())  # a real record...
    data = json.loads(pid_file.read_text())
    pid_file.write_text(json.dumps({"pid": dead.pid, "started_at": data["started_at"]}))
    assert read_pid_file(pid_file) is None  # ...whose process is gone
    # Our own pid with another start time: the pid was reused by a process that is not the service.
    pid_file.write_text(json.dumps({"pid": os.getpid(), "started_at": data["started_at"] - 3600}))
    assert read_pid_file(pid_file) is None
    pid_file.write_text("garbage")
    assert read_pid_file(pid_file) is None
    assert read_pid_file(tmp_path / "missing.pid") is None


def test_a_jump_of_the_wall_clock_leaves_a_live_process_alive(tmp_path: Path) -> None:
    """A virtual machine restored from a snapshot sees its wall clock jump: the start times read from it then
    disagree with the recorded ones, the start ticks since boot do not."""
    path = tmp_path / "me.pid"
    write_pid_file(path, os.getpid())
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps({**recorded, "started_at": recorded["started_at"] - 3600}))
    assert read_pid_file(path) is not None
    path.write_text(json.dumps({**recorded, "start_ticks": recorded["start_ticks"] - 1}))
    assert read_pid_file(path) is None, "another start time is another process"


# A service whose first `refusals` starts exit saying their port is taken (as a Go or Python server says it),
# and that counts its starts in `starts`.
SERVICE = """
import socket, sys
from pathlib import Path
port, refusals, starts = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
with starts.open("a") as f:
    f.write("x")
left = int(refusals.read_text())
if left > 0:
    refusals.write_text(str(left - 1))
    sys.exit(f"listen tcp 127.0.0.1:{port}: bind: address already in use")
server = socket.create_server(("127.0.0.1", port))
while True:
    server.accept()[0].close()
"""


def _service(tmp_path: Path, refusals: int, script: str = SERVICE) -> ManagedProcess:
    (tmp_path / "service.py").write_text(script)
    (tmp_path / "refusals").write_text(str(refusals))
    port = free_port()
    arguments = (str(port), str(tmp_path / "refusals"), str(tmp_path / "starts"))
    return ManagedProcess(
        name="Service",
        command=(sys.executable, str(tmp_path / "service.py"), *arguments),
        data_dir=tmp_path,
        host="127.0.0.1",
        ports=((port, "services.service.port"),),
    )


def _starts(tmp_path: Path) -> int:
    return len((tmp_path / "starts").read_text())


def test_a_service_that_lost_its_port_to_a_race_is_started_again(tmp_path: Path) -> None:
    service = _service(tmp_path, refusals=BIND_ATTEMPTS - 1)
    try:
        assert service.start(timeout_s=20)
        assert _starts(tmp_path) == BIND_ATTEMPTS
    finally:
        service.stop()


def test_a_port_taken_at_every_start_is_reported_after_the_last_attempt(tmp_path: Path) -> None:
    service = _service(tmp_path, refusals=BIND_ATTEMPTS)
    with pytest.raises(RuntimeError, match=r"(?s)Service did not come up.*address already in use"):
        service.start(timeout_s=20)
    assert _starts(tmp_path) == BIND_ATTEMPTS


def test_a_service_failing_for_another_reason_is_not_started_again(tmp_path: Path) -> None:
    failing = "import sys, pathlib; pathlib.Path(sys.argv[3]).write_text('x'); sys.exit('no such config')"
    service = _service(tmp_path, refusals=0, script=failing)
    with pytest.raises(RuntimeError, match="no such config"):
        service.start(timeout_s=20)
    assert _starts(tmp_path) == 1


# A parent that starts a child which ignores SIGTERM, prints its pid, and never reaps it: once killed, the
# child stays a zombie, as a detached service does under an init that does not reap.
UNREAPED = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def test_stopping_a_process_its_parent_never_reaps_returns_once_it_is_dead() -> None:
    """`rollout down` died with psutil.TimeoutExpired: a stopped service whose parent does not reap it stays a
    zombie, and waiting for the pid to vanish timed out. An exited process counts as stopped."""
    parent = subprocess.Popen([sys.executable, "-c", UNREAPED], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        started = time.monotonic()
        assert terminate(child, timeout_s=1.0), "SIGKILL stopped it"
        assert time.monotonic() - started < 5
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE, (
            "dead, and (as in the field) not reaped"
        )
    finally:
        parent.kill()
        parent.wait()
