"""`rollout up / status / down` as a user runs them: subprocesses, twice in a row, after SIGKILLs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from rollout.config import Settings
from rollout.ledger.migrate import head_revision
from rollout_testing.stacks import isolated_overrides

ROLLOUT = str(Path(sys.executable).parent / "rollout")

pytestmark = pytest.mark.slow


def rollout(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ROLLOUT, *args], capture_output=True, text=True, timeout=180)
    if check:
        assert done.returncode == 0, done.stderr + done.stdout
    return done


def services(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return {service["name"]: service for service in json.loads(done.stdout)["services"]}


def wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {pid} did not die"
        time.sleep(0.1)


def test_up_status_down_twice_and_after_sigkills(tmp_path: Path) -> None:
    overrides = isolated_overrides(tmp_path / "data")

    first = services(rollout("up", "--json", *overrides, check=True))
    assert first["postgres"]["healthy"] and first["temporal"]["healthy"] and first["blobs"]["healthy"]
    assert first["temporal"]["ui_url"].startswith("http://127.0.0.1:")
    assert f"schema {head_revision()}" in first["postgres"]["detail"]

    again = services(rollout("up", "--json", *overrides, check=True))  # up twice is harmless
    assert again["postgres"]["pid"] == first["postgres"]["pid"]
    assert again["temporal"]["pid"] == first["temporal"]["pid"]

    table = rollout("status", *overrides, check=True)
    assert "Temporal web UI: http://127.0.0.1:" in table.stdout

    # Kill both services without warning: the supervisor brings them back over the stale pid files, by itself,
    # and status says how often and how they ended.
    for name in ("postgres", "temporal"):
        os.kill(first[name]["pid"], signal.SIGKILL)
        wait_dead(first[name]["pid"])
    deadline = time.monotonic() + 60
    while not all(
        (s := services(rollout("status", "--json", *overrides)))[name]["healthy"] and s[name]["restarts"] == 1
        for name in ("postgres", "temporal")
    ):
        assert time.monotonic() < deadline, "the supervisor did not bring postgres and temporal back"
        time.sleep(0.5)
    revived = services(rollout("status", "--json", *overrides, check=True))
    assert revived["postgres"]["pid"] != first["postgres"]["pid"]
    assert revived["temporal"]["last_exit"] == "killed by SIGKILL"

    stopped = rollout("down", *overrides, check=True)
    assert "stopped: temporal, postgres" in stopped.stdout
    for name in ("postgres", "temporal"):
        wait_dead(revived[name]["pid"])
    assert rollout("status", "--json", *overrides).returncode == 1
    assert "nothing was running" in rollout("down", *overrides, check=True).stdout

    # A second cycle on the same data directory.
    assert services(rollout("up", "--json", *overrides, check=True))["postgres"]["healthy"]
    rollout("down", *overrides, check=True)


@pytest.mark.parametrize("setting", ["services.postgres.port", "services.temporal.ui_port"])
def test_a_taken_port_names_the_setting_to_change(tmp_path: Path, setting: str) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        overrides = [*isolated_overrides(tmp_path / "data"), f"{setting}={port}"]
        done = rollout("up", *overrides)
        rollout("down", *overrides)
    assert done.returncode == 1
    assert f"{port}: the port is taken" in done.stderr and f"`{setting}=PORT`" in done.stderr


def test_a_corrupt_data_directory_is_reported_and_left_untouched(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "postgres").mkdir(parents=True)
    (data / "postgres" / "precious.txt").write_text("not a cluster")
    done = rollout("up", *isolated_overrides(data))
    assert done.returncode == 1
    assert "is not a Postgres cluster" in done.stderr and "Nothing was deleted" in done.stderr
    assert (data / "postgres" / "precious.txt").read_text() == "not a cluster"

    a_file = tmp_path / "file"
    a_file.write_text("x")
    done = rollout("up", *isolated_overrides(a_file))
    assert done.returncode == 1 and "is a file, not a directory" in done.stderr


def test_config_errors_name_the_key_and_exit_2() -> None:
    done = rollout("status", "services.temporal.uiport=1")
    assert done.returncode == 2
    assert "unknown setting 'services.temporal.uiport'" in done.stderr


@pytest.mark.parametrize(
    ("command", "code", "said"),
    [
        (["gateway", "--port", "PORT"], 1, "is taken: choose another with `--port PORT`"),
        (["engine", "serve", "--port", "PORT", "--kind", "scripted", "--script", "x:y"], 1, "is taken"),
        (["engine", "serve", "--kind", "teapot"], 2, "--kind must be local, vllm, tinker or scripted"),
        (["engine", "serve", "--kind", "scripted"], 2, "--kind scripted needs --script"),
        (["engine", "follow", "--engine-url", "ftp://x"], 2, "--engine-url must be an http(s) URL"),
        (["sandbox", "serve", "--seats", "0"], 2, "--seats and --count must be at least 1"),
        (["sandbox", "serve", "--count", "2", "--port", "PORT"], 2, "leave out --port"),
        (["sandbox", "serve", "--port", "PORT"], 1, "is taken"),
    ],
)
def test_a_service_that_cannot_start_as_asked_says_why_in_one_paragraph(
    tmp_path: Path, command: list[str], code: int, said: str
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        done = rollout(*(port if part == "PORT" else part for part in command), f"data_dir={tmp_path}")
    assert done.returncode == code, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_unreachable_ledger_names_the_url_without_its_password(tmp_path: Path) -> None:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    done = rollout(
        "ledger", "tail", "run/x", f"services.postgres.url=postgresql://me:s3cret@127.0.0.1:{number}/rollout"
    )
    assert done.returncode == 1
    assert f"cannot reach the ledger at postgresql://me:***@127.0.0.1:{number}/rollout" in done.stderr
    assert "s3cret" not in done.stderr and "rollout up" in done.stderr


def test_ledger_tail_prints_a_stream_as_json_lines(stack_settings: Settings, stream: str) -> None:
    import asyncio

    from rollout.ledger import Ledger, NewEvent

    async def write() -> None:
        async with await Ledger.connect(stack_settings.ledger_url) as ledger:
            await ledger.append(stream, [NewEvent("a", "T", {"n": 1}), NewEvent("b", "T", {"n": 2})])

    asyncio.run(write())
    postgres = stack_settings.services.postgres
    tail = ("ledger", "tail", stream, "--after", "1", f"services.postgres.port={postgres.port}")
    elsewhere = rollout(*tail, "data_dir=/nonexistent")
    assert elsewhere.returncode != 0 and "passwords in its data directory" in elsewhere.stderr, (
        elsewhere.stderr
    )
    done = rollout(*tail, f"data_dir={stack_settings.data_path}", check=True)
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"seq": 2, "key": "b", "kind": "T", "payload": {"n": 2}}
    ]


def test_config_show_prints_the_composed_settings_as_json() -> None:
    done = rollout("config", "show", "--json", "services.temporal.ui_port=8300", check=True)
    assert json.loads(done.stdout)["services"]["temporal"]["ui_port"] == 8300


STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"


def test_down_returns_within_30_s_and_names_the_services_it_had_to_kill(tmp_path: Path) -> None:
    from rollout.stack.processes import write_pid_file

    overrides = isolated_overrides(tmp_path / "data", gateway=True)
    run = tmp_path / "data" / "run"
    run.mkdir(parents=True)
    started: dict[str, subprocess.Popen[str]] = {}
    for name, code in [
        ("gateway", STUBBORN),  # ignores SIGTERM, as a service stuck in a blocking call does
        ("temporal", STUBBORN),
        ("runner", "import time; print('up', flush=True); time.sleep(600)"),  # stops when asked
    ]:
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert process.stdout is not None and process.stdout.readline() == "up\n"
        started[name] = process
        write_pid_file(run / f"{name}.pid", started[name].pid)
    began = time.monotonic()
    done = rollout("down", *overrides, check=True)
    took = time.monotonic() - began
    assert took <= 30, f"down took {took:.0f} s"
    assert "stopped: runner, gateway, temporal" in done.stdout, done.stdout
    killed = next(line for line in done.stdout.splitlines() if line.startswith("killed"))
    assert "gateway" in killed and "temporal" in killed and "runner" not in killed
    for process in started.values():
        assert process.wait(timeout=5) is not None
    assert started["runner"].returncode == -signal.SIGTERM
    assert started["gateway"].returncode == started["temporal"].returncode == -signal.SIGKILL
    assert not any(run.glob("*.pid")), "no pid file names a process that is gone"
