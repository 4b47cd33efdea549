"""`rollout run status` and `run list` for a run whose workflow nothing executes (the workers are down,
`rollout up` not run again): the run shows as waiting for a worker, at once, in the table and in `--json`,
never as a traceback. Real Postgres and Temporal; the run's workflow is started on a task queue no worker
polls."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from temporalio.client import Client

from rollout.config import Settings
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import run_stream
from rollout.workflows.names import run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout_testing.stacks import monitor_overrides

ROLLOUT = str(Path(sys.executable).parent / "rollout")


async def test_a_run_no_worker_answers_is_listed_as_waiting_for_one(
    stack_settings: Settings, ledger: Ledger, models_dir: Path
) -> None:
    run = f"orphan-{uuid.uuid4().hex[:8]}"
    created = {
        "run": run,
        "environment": "tests.example_envs:coin",
        "settings": {"max_lag": 1, "paused": False},
    }
    await ledger.append_one(run_stream(run), NewEvent("created", Kind.RUN_CREATED, created))
    client = await Client.connect(stack_settings.temporal_address)
    handle = await client.start_workflow(
        RunWorkflow.run,
        RunInput(run, "tests.example_envs:coin"),
        id=run_workflow_id(run),
        task_queue=f"nobody-polls-{run}",
    )
    overrides = monitor_overrides(stack_settings, models_dir)
    try:
        started = time.monotonic()
        shown = await _rollout("run", "status", run, "--json", *overrides)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-3000:]
        assert json.loads(shown.stdout)["state"] == "waiting for a worker (`rollout up`)"
        # The CLI's start-up and the ledger's numbers included; Temporal would hold the query 30 s.
        assert time.monotonic() - started < 20, "a queue no worker polls is seen at once"

        listed = await _rollout("run", "list", "--json", *overrides)
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr[-3000:]
        row = next(row for row in json.loads(listed.stdout) if row["run"] == run)
        assert row["state"] == "waiting for a worker (`rollout up`)"
        assert row["episodes_finished"] == 0 and row["steps"] == 0

        table = await _rollout("run", "list", *overrides, env={"COLUMNS": "200"})  # one line per run
        assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr[-3000:]
        assert "waiting for a worker" in table.stdout, table.stdout
    finally:
        await handle.terminate("test over")


async def _rollout(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    process = await asyncio.create_subprocess_exec(
        ROLLOUT, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})}
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return subprocess.CompletedProcess(args, process.returncode, stdout.decode(), stderr.decode())


def test_a_run_update_is_told_in_words_not_as_a_dict() -> None:
    """`rollout run resume` printed the status dict's keys and values; it says what the run does now."""
    from rollout.cli.run import describe_status

    status = {
        "run": "r1",
        "paused": False,
        "stopped": False,
        "max_lag": 2,
        "episodes_finished": 0,
        "episodes_failed": 0,
        "groups_finished": 0,
        "pause_reason": None,
        "trained": {"default": "r1-default-step000006", "coach": None},
    }
    assert describe_status(status) == "run [bold]r1[/] playing · max_lag 2 · default at r1-default-step000006"
    paused = {**status, "paused": True, "pause_reason": "too many failed episodes", "trained": {}}
    assert "paused (too many failed episodes) · max_lag 2 · no checkpoint yet" in describe_status(paused)
    ended = {**status, "stopped": True, "episodes_finished": 12, "episodes_failed": 1}
    assert describe_status(ended).endswith(
        "stopped · max_lag 2 · default at r1-default-step000006 · 12 episodes (1 failed)"
    )
    assert "`rollout run status r1` shows it" in describe_status({"run": "r1", "workflow": "run/r1"})


def test_the_summary_says_whether_the_reward_rose() -> None:
    from rollout.control.progress import Step, TrainingProgress

    progress = TrainingProgress("r", "default")
    assert progress.learned() is None, "no steps: nothing to say"
    rewards = [0.1] * 10 + [0.2] * 5 + [0.35] * 10
    progress.steps = [Step(i + 1, f"s{i + 1}", {"reward_mean": r}) for i, r in enumerate(rewards)]
    assert progress.learned() == (
        "reward rose from 0.100 (mean of the first 10 steps) to 0.350 (the last 10): +0.250"
    )
    assert progress.summary()["reward_first"] == 0.1 and progress.summary()["reward_last"] == 0.35
    progress.steps = [*progress.steps[:5], Step(6, "s6", {"reward_mean": float("nan")})]
    assert progress.learned() == "reward did not move: 0.100 (mean of the first 2 steps and of the last 2)"


def test_a_run_of_several_policies_shows_each_side_by_side() -> None:
    from rollout.control.progress import Step, TrainingProgress, run_line

    speaker, listener = TrainingProgress("r", "speaker"), TrainingProgress("r", "listener")
    assert run_line([speaker]) == speaker.line(), "one policy: the line as it always was"
    speaker.steps = [Step(3, "r/speaker-step000003", {"reward_mean": 0.25, "kl_k3": 0.001})]
    speaker.episodes = listener.episodes = 24
    listener.batches_skipped = 2
    assert run_line([speaker, listener]) == (
        "speaker: step 3 · reward 0.250 · staleness 0.00 · KL 0.0010 · served 0/1 | listener: waiting for its "
        "first batch · 24 episodes · 2 batches skipped (no signal)"
    )


def test_run_status_draws_each_policys_curves_and_run_list_counts_each_ones_steps() -> None:
    from datetime import UTC, datetime

    from rollout.cli.run import policy_lines, steps_said
    from rollout.cli.sparkline import sparkline
    from rollout.control.runs import policy_curves
    from rollout.ledger.views import StepRow

    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█" and sparkline([2.0, None, 2.0]) == "▄ ▄"
    assert sparkline([]) == "" and len(sparkline(range(100), width=30)) == 30
    now = datetime.now(UTC)
    steps = [
        StepRow(f"r/{policy}", version, f"r/{policy}-step{version:06d}", None, metrics, now)
        for version, (policy, metrics) in enumerate(
            [
                ("speaker", {"reward_mean": 0.1, "loss": 2.0}),
                ("listener", {"reward_mean": 0.3}),
                ("speaker", {"reward_mean": 0.4, "loss": 1.0}),
            ],
            start=1,
        )
    ]
    curves = policy_curves("r", steps)
    assert curves == {
        "speaker": {"step": [1, 3], "reward": [0.1, 0.4], "loss": [2.0, 1.0]},
        "listener": {"step": [2], "reward": [0.3], "loss": [None]},
    }
    assert policy_lines(curves) == [
        "  speaker   2 steps · reward ▁█ 0.4 · loss █▁ 1",
        "  listener  1 step · reward ▄ 0.3",
    ]
    one = {"run": "r", "steps": 3, "policies": {"r/default": {"checkpoints": 3}}}
    assert steps_said(one) == "3"
    two = {
        "run": "r",
        "steps": 5,
        "policies": {"r/speaker": {"checkpoints": 3}, "r/listener": {"checkpoints": 2}},
    }
    assert steps_said(two) == "speaker 3 · listener 2"
