"""Evals as a user drives them, with real processes on an embedded stack: bad input is refused with nothing
recorded, `rollout train … eval.every=2` scores checkpoints 2 and 4, a runner SIGKILLed mid-eval changes no
score and doubles no turn, and a Temporal Schedule fires, pauses, survives a restart of the Temporal dev server
and resumes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rollout.config import Settings, load
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import count_events, run_turns
from rollout.ledger.streams import run_episodes_stream
from rollout.stack.processes import read_pid_file
from tests.stackutil import isolated_overrides

ROLLOUT = str(Path(sys.executable).parent / "rollout")

pytestmark = pytest.mark.slow

SUITE = """
name: quick
version: 1
environments:
  - environment: arithmetic.environment:environment
    episodes: {episodes}
"""


def rollout(
    *args: str, cwd: Path, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ROLLOUT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return done


def ledger_read[T](settings: Settings, read: Callable[[Ledger], Awaitable[T]]) -> T:
    async def go() -> T:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            return await read(ledger)

    return asyncio.run(go())


def schedule_row(overrides: list[str], cwd: Path) -> dict[str, Any] | None:
    rows = json.loads(rollout("eval", "schedules", "list", "--json", *overrides, cwd=cwd).stdout)
    return rows[0] if rows else None


def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(1)


@pytest.mark.timeout(1200)
def test_evals_from_the_command_line(tmp_path: Path, models_dir: Path) -> None:
    overrides = [
        *isolated_overrides(tmp_path / "data", gateway=True),
        f"models_dir={models_dir}",
        "preset=cpu-micro",
    ]
    settings = load(overrides)
    (tmp_path / "quick.yaml").write_text(SUITE.format(episodes=4))
    (tmp_path / "changed.yaml").write_text(SUITE.format(episodes=5))
    (tmp_path / "long.yaml").write_text(SUITE.format(episodes=10).replace("version: 1", "version: 2"))
    try:
        rollout("up", *overrides, cwd=tmp_path)

        # Bad input: one paragraph each, exit 1, nothing recorded.
        for args, said in [
            (("eval", "run", "nosuch"), "no suite 'nosuch'"),
            (("eval", "run", "quick.yaml", "--checkpoint", "nosuch/default-step000001"), "no checkpoint"),
            (("eval", "schedule", "quick.yaml", "--cron", "every minute"), "Temporal refused the schedule"),
        ]:
            refused = rollout(*args, *overrides, cwd=tmp_path, check=False)
            assert refused.returncode == 1 and said in refused.stderr and "Traceback" not in refused.stderr
        assert json.loads(rollout("eval", "results", "--json", *overrides, cwd=tmp_path).stdout) == []
        rollout("eval", "register", "quick.yaml", *overrides, cwd=tmp_path)
        changed = rollout("eval", "register", "changed.yaml", *overrides, cwd=tmp_path, check=False)
        assert changed.returncode == 1 and "bump its version" in changed.stderr

        # Training scores every checkpoint.
        trained = rollout(
            "train",
            "arithmetic.environment:environment",
            "--preset",
            "cpu-micro",
            "trainer.steps=2",
            "eval.suite=quick",
            "eval.every=1",
            "--run",
            "trained",
            "--json",
            *overrides,
            cwd=tmp_path,
        )
        summary = json.loads(trained.stdout.strip().splitlines()[-1])
        assert [e["checkpoint"] for e in summary["evals"]] == [
            "trained/default-step000001",
            "trained/default-step000002",
        ], "the run waits for its evals and says their scores"
        scored = json.loads(rollout("eval", "results", "quick", "--json", *overrides, cwd=tmp_path).stdout)
        assert sorted(r["checkpoint"] for r in scored) == [
            "trained/default-step000001",
            "trained/default-step000002",
        ]
        assert all(r["episodes"] == 4 and r["failed"] == 0 for r in scored)
        gate = rollout(
            "eval",
            "compare",
            "quick",
            "trained/default-step000001",
            "latest:trained/default",
            "--max-drop",
            "1",
            *overrides,
            cwd=tmp_path,
        )
        assert "arithmetic" in gate.stdout

        # A runner SIGKILLed mid-eval: the eval finishes, each episode and its turn recorded once.
        evaluating = subprocess.Popen(
            [ROLLOUT, "eval", "run", "long.yaml", "--checkpoint", "base", "--json", *overrides],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        eval_run = None

        def some_played() -> bool:
            nonlocal eval_run
            runs = ledger_read(settings, lambda ledger: _eval_runs(ledger))
            eval_run = next((r for r in runs if r.startswith("eval-quick-2-")), None)
            return eval_run is not None and _finished(settings, eval_run) >= 3

        wait_until(some_played, 300, "the eval played no episode")
        runner = read_pid_file(tmp_path / "data" / "run" / "runner.pid")
        assert runner is not None
        os.kill(runner.pid, signal.SIGKILL)
        out, errors = evaluating.communicate(timeout=600)
        assert evaluating.returncode == 0, errors[-3000:]
        (score,) = json.loads(out.strip().splitlines()[-1])["scores"]
        assert (score["episodes"], score["failed"]) == (10, 0)
        played = eval_run
        assert played is not None and _finished(settings, played) == 10
        turns = ledger_read(settings, lambda ledger: run_turns(ledger, played))
        assert len(turns) == 10 and len({t.payload["seat"] for t in turns}) == 10, "one turn per episode"
        results = json.loads(rollout("eval", "results", "quick@2", "--json", *overrides, cwd=tmp_path).stdout)
        assert [r["score"] for r in results] == [score["score"]], "one result, the one printed"

        # A schedule fires, pauses, outlives a restart of the Temporal dev server, resumes, and is deleted.
        rollout(
            "eval", "schedule", "quick@1", "--every", "2", "--checkpoint", "base", *overrides, cwd=tmp_path
        )
        wait_until(
            lambda: (schedule_row(overrides, tmp_path) or {}).get("fired", 0) >= 2, 120, "never fired twice"
        )
        (schedule_id,) = [row["schedule"] for row in [schedule_row(overrides, tmp_path)] if row]
        rollout("eval", "schedules", "pause", schedule_id, *overrides, cwd=tmp_path)
        fired = (schedule_row(overrides, tmp_path) or {})["fired"]
        time.sleep(6)
        assert (schedule_row(overrides, tmp_path) or {})["fired"] == fired, "a paused schedule does not fire"
        temporal = read_pid_file(tmp_path / "data" / "run" / "temporal.pid")
        assert temporal is not None
        os.kill(temporal.pid, signal.SIGKILL)
        wait_until(
            lambda: rollout("status", "--json", *overrides, cwd=tmp_path, check=False).returncode == 0,
            180,
            "the supervisor did not bring Temporal back",
        )
        kept = schedule_row(overrides, tmp_path)
        assert kept is not None and kept["schedule"] == schedule_id and kept["paused"] is True
        rollout("eval", "schedules", "resume", schedule_id, *overrides, cwd=tmp_path)
        wait_until(
            lambda: (schedule_row(overrides, tmp_path) or {}).get("fired", 0) > fired,
            120,
            "no firing after resume",
        )
        rollout("eval", "schedules", "delete", schedule_id, *overrides, cwd=tmp_path)
        assert schedule_row(overrides, tmp_path) is None
        base = [
            r
            for r in json.loads(
                rollout("eval", "results", "quick@1", "--json", *overrides, cwd=tmp_path).stdout
            )
        ]
        assert [r["checkpoint"] for r in base].count("base") == 1, "every firing found the one result"
    finally:
        rollout("down", *overrides, cwd=tmp_path, check=False)


async def _eval_runs(ledger: Ledger) -> list[str]:
    from rollout.ledger.queries import list_runs

    return [run.run for run in await list_runs(ledger)]


def _finished(settings: Settings, run: str) -> int:
    return ledger_read(
        settings, lambda ledger: count_events(ledger, run_episodes_stream(run), Kind.EPISODE_FINISHED)
    )
