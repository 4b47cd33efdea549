"""The embedded stack's supervisor, as a user meets it: services SIGKILLed come back by themselves, `rollout
status` says how often and how they ended, a service that keeps dying is retried with growing backoff, and
`rollout up` on a half-dead stack (the supervisor killed too) restarts what is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rollout.stack.embedded import Stack
from rollout.stack.processes import read_pid_file
from rollout.stack.supervisor import ServiceSpec, read_state, want
from rollout_testing.stacks import isolated_overrides

ROLLOUT = str(Path(sys.executable).parent / "rollout")


def rollout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ROLLOUT, *args], capture_output=True, text=True, timeout=300)


def status(overrides: list[str]) -> dict[str, dict]:
    done = rollout("status", "--json", *overrides)
    return {service["name"]: service for service in json.loads(done.stdout)["services"]}


def wait_until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_up_on_a_half_dead_stack_restarts_the_supervisor_and_what_died_with_it(tmp_path: Path) -> None:
    overrides = isolated_overrides(tmp_path / "data")
    try:
        assert rollout("up", *overrides).returncode == 0
        before = status(overrides)
        assert before["supervisor"]["healthy"] and before["temporal"]["restarts"] == 0
        os.kill(before["supervisor"]["pid"], signal.SIGKILL)
        os.kill(before["temporal"]["pid"], signal.SIGKILL)
        time.sleep(1)
        down = status(overrides)
        assert not down["supervisor"]["healthy"] and not down["temporal"]["healthy"], down
        assert "nothing restarts a service" in down["supervisor"]["detail"]
        assert rollout("status", *overrides).returncode == 1

        up = rollout("up", "--json", *overrides)
        assert up.returncode == 0, up.stderr
        after = status(overrides)
        assert all(after[name]["healthy"] for name in ("supervisor", "postgres", "temporal")), after
        assert after["supervisor"]["pid"] != before["supervisor"]["pid"]
        assert after["postgres"]["pid"] == before["postgres"]["pid"], "a service that still ran is kept"
        assert after["temporal"]["restarts"] == 1  # the count carries over to the new supervisor
        assert after["temporal"]["last_exit"].startswith("exited (status unknown"), after["temporal"]
        assert "restarts" in rollout("status", *overrides).stdout  # a column of the table
    finally:
        rollout("down", *overrides)
    assert read_pid_file(tmp_path / "data" / "run" / "supervisor.pid") is None, "down stops the supervisor"


def test_a_service_that_keeps_dying_is_retried_with_growing_backoff(tmp_path: Path) -> None:
    overrides = isolated_overrides(tmp_path / "data")
    from rollout import config

    stack = Stack(config.load(overrides))
    try:
        stack.up()
        crashing = ServiceSpec(name="Crasher", command=(sys.executable, "-c", "import sys; sys.exit(3)"))
        with stack._lock():
            want(stack.data_dir, crashing)
        wait_until(
            lambda: (
                (read_state(stack.data_dir).get("Crasher") or None)
                and read_state(stack.data_dir)["Crasher"].restarts >= 3
            ),
            30,
            "three restarts",
        )
        state = read_state(stack.data_dir)["Crasher"]
        assert state.last_exit == "exit 3"
        log = (stack.data_dir / "logs" / "supervisor.log").read_text()
        delays = [
            line.rsplit("next start in ", 1)[1] for line in log.splitlines() if "Crasher: exit 3" in line
        ]
        assert delays[:3] == ["1s", "2s", "4s"], delays
    finally:
        stack.down()


def test_up_reports_a_service_that_cannot_start_and_stops_retrying_it(tmp_path: Path) -> None:
    import socket

    overrides = isolated_overrides(tmp_path / "data")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    overrides = [o for o in overrides if not o.startswith("services.temporal.port=")]
    overrides.append(f"services.temporal.port={taken}")
    try:
        done = rollout("up", *overrides)
        assert done.returncode != 0
        assert "port is taken" in done.stderr and "services.temporal.port" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        from rollout.stack.supervisor import wanted

        assert [spec.name for spec in wanted((tmp_path / "data").resolve())] == ["Postgres"]
    finally:
        holder.close()
        rollout("down", *overrides)
