"""A user's environment with bugs (tests/user_folder/buggy): each bug is bounded, named in the user's terms
with its place in their code, and never retried when a retry would fail the same way."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

FOLDER = Path(__file__).parent / "user_folder"
ROLLOUT = str(Path(sys.executable).parent / "rollout")


def test_env_check_bounds_each_call_and_names_each_bug_where_it_is() -> None:
    began = time.monotonic()
    checked = subprocess.run(
        [ROLLOUT, "env", "check", "buggy.environment:environment", "--tasks", "10", "--json"],
        cwd=FOLDER,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - began
    assert checked.returncode == 1, checked.stderr
    assert took < 30, f"a hanging respond is bounded by its 2 s limit, yet the check took {took:.0f} s"
    report = json.loads(checked.stdout)
    found = {
        f["where"].split(" agent ")[0].removesuffix(" task source"): f["problem"] for f in report["findings"]
    }
    line = re.compile(r"\(buggy/environment\.py:\d+\)$")
    task = "buggy.environment:environment task"
    assert found[f"{task} 1"].startswith("respond did not return within 2 s (Environment.turn_timeout_s)")
    assert line.search(found[f"{task} 1"]), "a timeout names the method that did not return"
    assert found[f"{task} 2"].startswith("respond raised KeyError: 'no such answer'") and line.search(
        found[f"{task} 2"]
    )
    assert found[f"{task} 3"].startswith("the task's reward nan is not a finite number") and line.search(
        found[f"{task} 3"]
    )
    assert found[f"{task} 5"].startswith("the task source's draw 5 raised IndexError: no row for group 5")
    assert line.search(found[f"{task} 5"])
    assert found[f"{task} 6"].startswith("scripted_reply raised ValueError") and line.search(
        found[f"{task} 6"]
    )
    assert found[f"{task} 9"].startswith(
        "the task source's draw 9 did not return within 2 s (Environment.turn_timeout_s)"
    ) and line.search(found[f"{task} 9"]), "a synchronous call that blocks is bounded too"
    assert set(found) == {f"{task} {g}" for g in (1, 2, 3, 5, 6, 9)}, found
    rewards = [(play["reward"], play["truncated"]) for play in report["plays"]]
    assert rewards.count((1.0, False)) == 3, f"groups 0, 7 and 8 play well: {rewards}"
    assert (0.0, True) in rewards, (
        "group 4's long observation is no bug to a scripted model: it runs out of turns"
    )


def test_a_runner_plays_a_fixed_environment_on_its_new_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fixing a paused run's environment and resuming it needs no runner restart: a changed module is imported
    again."""
    import os

    from rollout.activities.runner import _load  # pyright: ignore[reportPrivateUsage]

    module = tmp_path / "fixable_env.py"
    source = """
from rollout.environment import Dataset, Environment
from rollout.harness import End, Observation, Task

class Fixable(Task):
    async def start(self, run):
        return Observation("hi")

    async def respond(self, run, reply):
        return End(reward=REWARD)

REWARD = {reward}
environment = Environment("fixable", lambda parameters, agent: Fixable(), Dataset([{{}}]), max_turns={turns})
"""
    module.write_text(source.format(reward="float('nan')", turns=1))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _load("fixable_env:environment").max_turns == 1
    module.write_text(source.format(reward="1.0", turns=2))
    os.utime(module, (time.time() + 5, time.time() + 5))  # a change within the same second still counts
    assert _load("fixable_env:environment").max_turns == 2, "the fixed code"
