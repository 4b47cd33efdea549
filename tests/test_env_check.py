"""`rollout env check` and the run commands' input checks, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.control.env_check import check_environment

ROLLOUT = str(Path(sys.executable).parent / "rollout")


def rollout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ROLLOUT, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("reference", ["arithmetic.environment:environment", "arithmetic.environment:easy"])
def test_the_arithmetic_environments_pass_their_check(reference: str) -> None:
    checked = rollout("env", "check", reference, "--json")
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] and report["plays"] == [
        {"agent": "solver", "turns": 1, "reward": 1.0, "truncated": False, "tools": []}
    ]


@pytest.mark.parametrize(
    ("reference", "says"),
    [
        ("tests.example_envs:raises", "respond raised RuntimeError: the environment broke on purpose"),
        ("tests.example_envs:not_finite", "not a finite number"),
        ("tests.example_envs:not_an_environment", "is a int, not a rollout.environment.Environment"),
        ("no_such_package.env:environment", "module 'no_such_package.env' does not import"),
        ("arithmetic", "write it as package.module:attribute"),
    ],
)
def test_a_broken_environment_fails_its_check_naming_what_and_where(reference: str, says: str) -> None:
    checked = rollout("env", "check", reference)
    assert checked.returncode == 1
    assert says in checked.stderr and reference.split(":")[0] in checked.stderr


async def test_bad_tool_schemas_are_findings() -> None:
    report = await check_environment("tests.example_envs:bad_tools")
    problems = [f.problem for f in report.findings]
    assert any("tool name 'run shell'" in p for p in problems)
    assert any("required parameter 'cmd' is not in 'properties'" in p for p in problems)


def test_run_start_refuses_a_max_lag_that_would_admit_no_turn_in_one_line() -> None:
    refused = rollout("run", "start", "arithmetic.environment:environment", "--max-lag", "-1")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "bad value for '--max-lag': -1" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    refused = rollout("run", "start", "arithmetic.environment:environment", "run.max_lag=-1")
    assert refused.returncode == 2 and "bad value for 'run.max_lag': -1" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_train_refuses_a_trainer_setting_out_of_range_in_one_line_before_anything_starts() -> None:
    """`trainer.groups_per_batch=0` played episodes forever and never trained: refused at load, as a negative
    `trainer.refill_max` is, one line each and no traceback (no stack starts: it would take minutes)."""
    for bad, says in (
        (
            "trainer.groups_per_batch=0",
            "bad value for 'trainer.groups_per_batch': 0 would play episodes forever",
        ),
        ("trainer.refill_max=-1", "bad value for 'trainer.refill_max': -1 is not a number of groups"),
    ):
        refused = rollout("train", "arithmetic.environment:environment", bad)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert says in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_run_set_takes_max_lag_only() -> None:
    for bad in ("-1", "lots"):  # checked as every max_lag is, in one line naming the setting and its range
        refused = rollout("run", "set", "some-run", f"max_lag={bad}")
        said = refused.stderr
        assert refused.returncode == 2 and "bad value for 'max_lag'" in said and bad in said, said
        assert "0 (on-policy) or more" in said and "Traceback" not in said
    refused = rollout("run", "set", "some-run", "temperature=2")
    assert refused.returncode == 2 and "max_lag=N" in refused.stderr
