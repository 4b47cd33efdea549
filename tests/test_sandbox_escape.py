"""The red team: a hostile policy plays a shell-sandbox environment through the real stack (scripted engine,
gateway, runner, sandbox servers, ledger, Temporal) and tries to get out, each attack its own tool call; a
command seat (a script standing in for Claude Code) tries the same from its own jail in the same episodes, on
the runner and on a command host of its own (`sandbox.command_pool`).

Every attack must fail and say so in its answer, the stack must keep serving, nothing may outlive its claim,
and the run must finish with its expected counts and no reward above what an honest agent that changed nothing
earns. The attacks that would harm this machine if a jail failed (a signal, a fork bomb, a 10 GB write) run
only after the agent saw its PID namespace and rlimits in force (tests/red_team.py). Only loopback ports of
this machine are probed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from importlib import resources
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from coding.tasks import task_named
from rollout.config import Settings
from rollout.ledger import Kind, Ledger, RecordedEvent
from rollout.ledger.streams import run_episodes_stream, run_stream
from rollout.run.settings import RunSettings, RunStatus
from rollout.sandbox.hosting import sandbox_workdir
from rollout.workflows.names import run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout_testing.cluster import Cluster
from tests.red_team import HARMFUL, KIND, SEAT_FAILURE, SEAT_VENV, SHELL_FILE_LIMIT, TARGETS, attacks

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

HONEST_REWARD = 0.6  # clamp's unmodified repository: 3 of its 5 hidden tests pass


@pytest.fixture(scope="module")
def seat_venv() -> Path:
    """The command seat's interpreter: a virtual environment with the `coding` wheel installed non-editable,
    the image's layout, where its grader's answers sit in site-packages."""
    uv = os.environ.get("UV") or shutil.which("uv") or "uv"
    shutil.rmtree(SEAT_VENV, ignore_errors=True)
    subprocess.run([uv, "venv", "-q", str(SEAT_VENV), "--python", sys.executable], check=True)
    coding = Path(__file__).parents[1] / "envs" / "coding"
    install = [
        uv,
        "pip",
        "install",
        "-q",
        "--python",
        str(SEAT_VENV / "bin" / "python"),
        "--no-deps",
        str(coding),
    ]
    subprocess.run(install, check=True)
    return SEAT_VENV / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _play(
    settings: Settings, task_queue: str, run: str
) -> tuple[RunStatus, list[RecordedEvent], RunSettings]:
    client = await Client.connect(settings.temporal_address)
    status: RunStatus = await asyncio.wait_for(
        client.execute_workflow(
            RunWorkflow.run,
            RunInput(run, "tests.red_team:environment", groups_in_flight=1, max_groups=1),
            id=run_workflow_id(run),
            task_queue=task_queue,
        ),
        600,
    )
    async with await Ledger.connect(settings.ledger_url) as ledger:
        events = await ledger.read(run_episodes_stream(run))
        created = (await ledger.read(run_stream(run)))[0]
    return (
        status,
        [e for e in events if e.kind == Kind.EPISODE_FINISHED],
        RunSettings.from_recorded(created.payload["settings"]),
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seat_host", ["runner", "command host"])
def test_a_hostile_policy_and_a_hostile_command_seat_get_nowhere(
    cluster: Cluster, stack_settings: Settings, seat_host: str, seat_venv: Path
) -> None:
    engine_url = cluster.engine(script="tests.red_team:red_team_policy")
    gateway_url = cluster.gateway(engine_url)
    pool = ""
    if seat_host == "command host":  # the command seat plays on a command host of its own (the chart's way)
        pool = f"command#red-team-{uuid.uuid4().hex[:6]}"
        runner = cluster.runner("runner-1", gateway_url, f"sandbox.command_pool='{pool}'")
        # The seat's interpreter and script are in this checkout: the host lets seats read it, nothing more.
        cluster.sandbox(pool, "seat-host", 1, f"sandbox.command_readable=[{ROOT}]")
    else:
        runner = cluster.runner("runner-1", gateway_url)
    cluster.sandbox(KIND, "box", seats=2)
    cluster.sandbox("shell#red-team-other", "other", seats=1)
    other = sandbox_workdir(cluster.root.resolve(), "shell#red-team-other", "other")
    (other / "secret.txt").write_text("another claim's file")
    victim = subprocess.Popen(["sleep", "600"])
    sleeper = f"1000.{uuid.uuid4().int % 1000:03d}"
    (cluster.root / "operator.key").write_text("the operator key")
    gateway = next(s for s in cluster.services if s.name == "gateway")
    targets = {
        "data_dir": str(cluster.root.resolve()),
        "operator_key": str((cluster.root / "operator.key").resolve()),
        "gateway_secret": str((cluster.root / "gateway.secret").resolve()),
        "sandbox_key": str((cluster.root / "sandbox.key").resolve()),
        "other_workdir": str(other),
        "hidden_tests": str(
            resources.files("coding.grader").joinpath("dataset", "01-clamp", "hidden_tests.py")
        ),
        "installed_hidden_tests": str(
            seat_venv / "coding" / "grader" / "dataset" / "01-clamp" / "hidden_tests.py"
        ),
        "venv": str(SEAT_VENV),
        "packages": str(seat_venv / "coding"),
        "ports": {
            "postgres": _port(stack_settings.ledger_url.rsplit("/", 1)[0]),
            "temporal": _port(stack_settings.temporal_address),
            "engine": _port(engine_url),
            "gateway": _port(gateway_url),
        },
        "pids": {"gateway": gateway.process.pid, "runner": runner.process.pid, "victim": victim.pid},
        "sleep": sleeper,
    }
    for path in ("operator_key", "gateway_secret", "sandbox_key", "hidden_tests", "installed_hidden_tests"):
        assert Path(targets[path]).is_file(), f"{path} is there to be attacked"
    TARGETS.write_text(json.dumps(targets))
    try:
        run = f"red-team-{uuid.uuid4().hex[:6]}"
        status, finished, settings = asyncio.run(_play(stack_settings, cluster.task_queue, run))
        if seat_host == "command host":
            assert settings.command_pool == pool, "the run records where its command seats ran"
        else:
            assert settings.command_pool is None
        assert status.episodes_finished == 2 and status.episodes_failed == 0, status

        names = [name for name, _ in attacks(targets)]
        assert len(finished) == 2
        for episode in finished:
            rewards, metrics = episode.payload["rewards"], episode.payload["metrics"]
            for agent in ("shell", "seat"):
                seen = metrics[agent]
                failure = SEAT_FAILURE.read_text() if SEAT_FAILURE.exists() else ""
                assert seen["in_force"] == 1.0, f"{agent} saw its jail in force: {seen} {failure}"
                through = [name for name in names if seen[f"attack/{name}"] != 1.0]
                assert not through, f"{agent}: these attacks got through or were skipped: {through}"
            assert metrics["shell"]["file_limit_kib"] == SHELL_FILE_LIMIT.file_bytes // 1024, (
                "the environment's SandboxSpec.limits reached the jail"
            )
            assert rewards["shell"] <= HONEST_REWARD and metrics["shell"]["tests_passed"] == 0.0, (
                "the forged solution earned nothing"
            )
        _, second = sorted(finished, key=lambda e: e.recorded_at)
        assert second.payload["metrics"]["shell"]["reset_cleared"] == 1.0, (
            "the next claim's workspace held nothing of the last one's, its chmod 000 folder included"
        )

        # The machine and the stack are as they were.
        assert victim.poll() is None, "the process the agents tried to signal lives"
        assert all(s.process.poll() is None for s in cluster.services), "every service of the stack runs"
        assert httpx.get(f"{gateway_url}/health").status_code == 200
        leftover = subprocess.run(["pgrep", "-f", f"sleep {sleeper}"], capture_output=True, text=True)
        assert leftover.stdout.strip() == "", "no setsid sleeper outlived its claim"
        assert not (SEAT_VENV / "bin" / "red-team-was-here").exists()
        assert not (Path(targets["packages"]) / "red-team-was-here").exists()
        assert not list(Path(targets["data_dir"]).rglob("big")), "no 10 GB file landed in the data directory"
        assert set(HARMFUL) <= set(names)
        assert task_named("clamp").hidden_test_names()  # the grader still has its tests
    finally:
        victim.kill()
        victim.wait()
        TARGETS.unlink(missing_ok=True)
        SEAT_FAILURE.unlink(missing_ok=True)
