"""The chaos matrix as a test (the benchmark `uv run python -m benchmarks chaos` runs it with more steps and
seeds, plus a monkey): on one embedded stack started with `rollout up`, each of gateway, engine, runner,
trainer, Postgres and the Temporal server is SIGKILLed at a random moment of a `rollout train` run, and then
all of them at once with the supervisor (followed by `rollout up`). Every run must finish by itself with every
step trained once, every checkpoint created, converted and targeted once, no turn recorded twice, no
replayable episode abandoned, and the counts of the uninterrupted run (see `benchmarks.chaos.judge`).

Here the matrix kills the services that no other chaos test kills: the engine, the trainer and a runner are
killed mid-run by their own tests (tests/test_chaos_training.py, tests/test_chaos_episodes.py), which also
check what each must do after (serve the checkpoint again, lose its lease, replace the episode). The benchmark
runs every service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.chaos import Case, run_matrix

pytestmark = pytest.mark.slow


KILLED_HERE = ("gateway", "postgres", "temporal")
STEPS = 2  # a kill lands before, during or after the first step; the second shows the run goes on


@pytest.mark.timeout(1800)  # six training runs, four interrupted, on 2 cores
def test_every_service_killed_mid_run_loses_nothing_and_doubles_nothing(
    tmp_path: Path, models_dir: Path, tiny_qwen3: str
) -> None:
    cases = [
        *(Case(name=service, steps=STEPS, service=service) for service in KILLED_HERE),
        Case(name="everything", steps=STEPS, everything=True),
    ]
    # No warm-up run: a kill drawn later than a case's run lasts lands on its last step all the same.
    lines = run_matrix(
        cases, steps=STEPS, models_dir=models_dir, scratch=tmp_path, emit=lambda line: None, warm_up=False
    )
    failed = [line for line in lines if not line["ok"]]
    assert not failed, json.dumps(failed, indent=1)[-8000:]
    killed = {line["case"] for line in lines if line["killed"]}
    assert killed == {*KILLED_HERE, "everything"}
    for line in lines:
        if line["case"] in KILLED_HERE:
            # The supervisor restarted what was killed.
            assert line["restarts"].get(line["case"], 0) >= 1, line
