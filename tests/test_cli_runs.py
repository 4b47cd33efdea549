"""Runs as a user follows them, with real processes: an environment in the user's own folder (its episodes
claiming shell sandboxes, which `rollout train` serves) trains on a stack that was started elsewhere; a runner that cannot import an environment stops `train` before any run exists;
`run list` and `run status` show the ledger's numbers mid-run; and after `rollout train` and the trainer are
SIGKILLed, `rollout run attach` restarts the trainer with the run's recorded settings and finishes the run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.config import Settings, load
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import count_events
from rollout.ledger.streams import run_episodes_stream
from rollout.sandbox.hosting import sandbox_workdir
from rollout.stack.processes import read_pid_file
from tests.stackutil import isolated_overrides

ROLLOUT = str(Path(sys.executable).parent / "rollout")

pytestmark = pytest.mark.slow

# A user's environment, in a folder of its own: every reply earns a reward that varies with its text, so every
# group of the tiny random model carries signal and every batch trains. Each episode claims a shell sandbox
# (which `rollout train` serves) and has it say the word.
MY_ENV = """
from rollout.contracts import Message
from rollout.environment import Environment, Generator, SandboxSpec
from rollout.harness import End, Observation, RunContext, Task
from rollout.sandbox import SandboxClient
from rollout.sandbox.hosting import sandbox_workdir


class Echo(Task):
    def __init__(self, parameters: dict[str, str]) -> None:
        self.word = parameters["word"]

    async def start(self, run: RunContext) -> Observation:
        assert run.sandbox is not None
        async with SandboxClient(run.sandbox) as box:
            said = await box.act({"command": f"echo {self.word}"})
        return Observation(f"Say {said['output'].strip()}.")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=len(set(reply.text)) / (1 + len(reply.text)))


environment = Environment(
    name="my-env",
    make_task=lambda parameters, agent: Echo(parameters),
    source=Generator(lambda rng: {"word": rng.choice(["alpha", "beta", "gamma"])}),
    group_size=4,
    max_turns=1,
    sandbox=SandboxSpec("shell#my-env", wait_s=120),
)
"""

# Imports where the command runs, not on a runner: a stand-in for a module or file only the user's shell has.
RUNNER_CANNOT_IMPORT = """
import sys

if "worker" in sys.argv:
    raise ImportError("this environment needs a file that only the user's machine has")

from my_env import environment  # noqa: E402,F401
"""


def rollout(
    *args: str, cwd: Path, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ROLLOUT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return done


def runs(overrides: list[str], cwd: Path) -> dict[str, dict[str, Any]]:
    return {
        row["run"]: row for row in json.loads(rollout("run", "list", "--json", *overrides, cwd=cwd).stdout)
    }


def episodes_in_ledger(settings: Settings, run: str) -> int:
    async def count() -> int:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            return await count_events(ledger, run_episodes_stream(run), Kind.EPISODE_FINISHED)

    return asyncio.run(count())


def test_a_user_environment_trains_from_its_folder_and_a_killed_train_is_reattached(
    tmp_path: Path, models_dir: Path
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "my_env.py").write_text(MY_ENV)
    (project / "runner_cannot_import.py").write_text(RUNNER_CANNOT_IMPORT)
    overrides = [*isolated_overrides(tmp_path / "data", gateway=True), f"models_dir={models_dir}"]
    micro = ["--preset", "cpu-micro", "trainer.steps=3", *overrides]
    settings = load(["preset=cpu-micro", *overrides])
    try:
        rollout("up", "preset=cpu-micro", *overrides, cwd=elsewhere)  # the stack is up, started elsewhere

        # A runner that cannot import the environment: one paragraph, no traceback, and no run left behind.
        refused = rollout(
            "train", "runner_cannot_import:environment", *micro, "--run", "refused", cwd=project, check=False
        )
        assert refused.returncode == 2, refused.stderr
        assert "a runner cannot load runner_cannot_import:environment" in refused.stderr
        assert "only the user's machine has" in refused.stderr and "Traceback" not in refused.stderr
        assert "refused" not in runs(overrides, elsewhere)

        # The user's environment trains from its folder; output is not a terminal, so progress comes as lines.
        log = (tmp_path / "train.log").open("w")
        train = subprocess.Popen(
            [ROLLOUT, "train", "my_env:environment", *micro, "--run", "mine"],
            cwd=project,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while (row := runs(overrides, elsewhere).get("mine")) is None or row["episodes_finished"] < 1:
            assert train.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no episode within 5 minutes"
            time.sleep(1)

        # Mid-run (paused), `run list` and `run status` say what the ledger holds. A pause stops new groups, not
        # the trainer: a step on groups already played may still land, so they are read until they hold still.
        rollout("run", "pause", "mine", *overrides, cwd=elsewhere)
        deadline = time.monotonic() + 120
        while True:
            time.sleep(3)  # turns admitted before the pause finish their episodes
            status = json.loads(rollout("run", "status", "mine", "--json", *overrides, cwd=elsewhere).stdout)
            listed = runs(overrides, elsewhere)["mine"]
            again = json.loads(rollout("run", "status", "mine", "--json", *overrides, cwd=elsewhere).stdout)
            if again == status or time.monotonic() > deadline:
                break
        assert status["state"] == "paused" and status["environment"] == "my_env:environment"
        assert status["episodes_finished"] == episodes_in_ledger(settings, "mine") > 0
        assert status["max_lag"] == 1 and status["steps"] < 3
        assert listed["episodes_finished"] == status["episodes_finished"]
        assert listed["steps"] == status["steps"]

        # The train command and the trainer die; attach resumes the run and restarts the trainer with the run's
        # recorded settings (tiny-qwen3 with LoRA: a trainer on the defaults would train another model, whose
        # checkpoints the engine could not serve).
        train.send_signal(signal.SIGKILL)
        train.wait()
        log.close()
        trainer = read_pid_file(tmp_path / "data" / "run" / "trainer.pid")
        assert trainer is not None
        os.kill(trainer.pid, signal.SIGKILL)
        printed = (tmp_path / "train.log").read_text()
        assert "run mine: training tiny-qwen3 for 3 steps" in printed
        assert "episodes played" in printed or "step 1 · reward" in printed  # plain progress lines

        attached = rollout("run", "attach", "mine", "--json", *overrides, cwd=elsewhere, timeout=600)
        summary = json.loads(attached.stdout.strip().splitlines()[-1])
        assert summary["steps"] == 3 and set(summary["served"]) == set(summary["checkpoints"])
        assert summary["episodes"] > 0 and summary["episodes_failed"] == 0
        assert runs(overrides, elsewhere)["mine"]["state"] == "finished"
        sandboxes = read_pid_file(tmp_path / "data" / "run" / "sandboxes-shell-my-env.pid")
        assert sandboxes is not None, "the stack serves the sandboxes the run's episodes claim"
        data = (tmp_path / "data").resolve()
        assert sandbox_workdir(data, "shell#my-env", "stack-7").is_dir(), "2 groups of 4: 8"
        services = json.loads(rollout("status", "--json", *overrides, cwd=elsewhere, check=False).stdout)
        shown = next(s for s in services["services"] if s["name"] == "sandboxes-shell-my-env")
        assert shown["healthy"] and shown["detail"].startswith("8 sandbox(es)")
    finally:
        rollout("down", *overrides, cwd=elsewhere, check=False)
    assert read_pid_file(tmp_path / "data" / "run" / "sandboxes-shell-my-env.pid") is None, "down stops them"
