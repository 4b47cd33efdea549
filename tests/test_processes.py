"""Pid files: a reused pid is not mistaken for our service."""

import json
import os
import subprocess
import sys
from pathlib import Path

from rollout.stack.processes import read_pid_file, write_pid_file


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
