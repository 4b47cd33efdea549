"""The chaos matrix as a test (the benchmark `uv run python -m benchmarks chaos` runs it with more steps and
seeds, plus a monkey): on one embedded stack started with `rollout up`, each of gateway, engine, runner,
trainer, Postgres and the Temporal server is SIGKILLed at a random moment of a `rollout train` run, and then all
of them at once with the supervisor (followed by `rollout up`). Every run must finish by itself with every step
trained once, every checkpoint created, converted and targeted once, no turn recorded twice, no replayable
episode abandoned, and the counts of the uninterrupted run (see `benchmarks.chaos.judge`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.chaos import SERVICES, Case, matrix, run_matrix

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1800)  # eight training runs, each interrupted, on 2 cores
def test_every_service_killed_mid_run_loses_nothing_and_doubles_nothing(
    tmp_path: Path, models_dir: Path, tiny_qwen3: str
) -> None:
    cases = [
        *matrix(steps=3, seeds=1, extra=False, monkey_steps=0),
        Case(name="everything", steps=3, everything=True),
    ]
    lines = run_matrix(cases, steps=3, models_dir=models_dir, scratch=tmp_path, emit=lambda line: None)
    failed = [line for line in lines if not line["ok"]]
    assert not failed, json.dumps(failed, indent=1)[-8000:]
    killed = {line["case"] for line in lines if line["killed"]}
    assert killed == {*SERVICES, "everything"}
    for line in lines:
        if line["case"] in SERVICES:
            # The supervisor restarted what was killed (the trainer is killed and restarted the same way).
            assert line["restarts"].get(line["case"], 0) >= 1, line
