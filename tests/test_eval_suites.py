"""Eval suites as declared (YAML or Python), their content hash, the held-out task selections, and scoring."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rollout.environment import EVAL_TASKS, TRAIN_TASKS
from rollout.evals import EvalEnvironment, MetricError, Suite, SuiteError, load_suite, score
from rollout.evals.suites import suite_from_payload

YAML = """
name: mine
version: 3
environments:
  - environment: arithmetic.environment:environment
    episodes: 4
  - environment: math_env.environment:environment
    name: math
    metric: pass_rate
    threshold: 0.5
"""

PYTHON = """
from rollout.evals import EvalEnvironment, Suite

suite = Suite(
    name="mine",
    version="3",
    environments=(
        EvalEnvironment("arithmetic.environment:environment", episodes=4),
        EvalEnvironment("math_env.environment:environment", name="math", metric="pass_rate", threshold=0.5),
    ),
)
"""


def test_the_same_suite_in_yaml_or_python_has_one_hash(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(YAML)
    (tmp_path / "mine.py").write_text(PYTHON)
    from_yaml, from_python = load_suite(str(tmp_path / "mine.yaml")), load_suite(str(tmp_path / "mine.py"))
    assert from_yaml == from_python and from_yaml.ref == "mine@3"
    assert from_yaml.content_hash() == from_python.content_hash()
    assert [e.name for e in from_yaml.environments] == ["arithmetic", "math"]
    assert from_yaml.environments[0].temperature == 0.0 and from_yaml.environments[0].tasks == EVAL_TASKS
    changed = Suite("mine", "3", (EvalEnvironment("arithmetic.environment:environment", episodes=5),))
    assert changed.content_hash() != from_yaml.content_hash()
    assert suite_from_payload(from_yaml.payload()) == from_yaml


def test_the_shipped_smoke_suite_covers_the_three_environments() -> None:
    smoke = load_suite("smoke")
    assert [e.name for e in smoke.environments] == ["arithmetic", "gridworld", "math"]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("name: x\nversion: 1\nenvironments: []\n", "non-empty list"),
        ("name: x\nversion: 1\nenvironments: [a.b:c]\ncolour: red\n", "unknown field(s) colour"),
        ("name: 'a b'\nversion: 1\nenvironments: [a.b:c]\n", "`name` must be letters"),
        (
            "name: x\nversion: 1\nenvironments: [{environment: a.b:c, metric: median}]\n",
            "unknown metric 'median'",
        ),
        ("name: x\nversion: 1\nenvironments: [{environment: a.b:c, episodes: 0}]\n", "`episodes` must be"),
        (
            "name: x\nversion: 1\nenvironments: [{environment: a.b:c, seed: x}]\n",
            "`seed` must be a whole number",
        ),
        ("name: x\nversion: 1\nenvironments: [a.b:c, a.b:c]\n", "two environments are named alike"),
        ("name: x\nversion: 1\nenvironments: [{environment: nocolon}]\n", "package.module:attribute"),
        ("name: [x\n", "not valid YAML"),
    ],
)
def test_a_bad_declaration_names_what_is_wrong(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SuiteError) as raised:
        load_suite(str(path))
    assert complaint in str(raised.value) and str(path) in str(raised.value)


def test_an_unknown_suite_names_the_shipped_ones() -> None:
    with pytest.raises(SuiteError, match="smoke"):
        load_suite("no-such-suite")


def test_held_out_tasks_are_not_the_training_tasks() -> None:
    from arithmetic.environment import environment as arithmetic
    from math_env.environment import environment as math

    trained = [arithmetic.task_source(TRAIN_TASKS).parameters(g) for g in range(200)]
    held_out = [arithmetic.task_source(EVAL_TASKS).parameters(g) for g in range(20)]
    assert held_out != trained[:20]
    assert arithmetic.task_source("seed:7").parameters(0) != trained[0]
    train_rows = {math.task_source(TRAIN_TASKS).parameters(g)["question"] for g in range(100)}
    eval_rows = {math.task_source(EVAL_TASKS).parameters(g)["question"] for g in range(100)}
    assert eval_rows and not train_rows & eval_rows, "math holds out problems training never sees"
    with pytest.raises(ValueError, match="not a Generator"):
        math.task_source("seed:3")
    with pytest.raises(ValueError, match="unknown task selection"):
        math.task_source("test")


def test_scores_and_their_intervals() -> None:
    mean = score("mean_reward", [1.0, 0.0, 1.0, 1.0])
    assert mean.value == 0.75 and mean.episodes == 4
    assert mean.low < 0.75 < mean.high and math.isclose(0.75 - mean.low, mean.high - 0.75)
    single = score("mean_reward", [0.5])
    assert (single.low, single.high) == (0.5, 0.5)
    passed = score("pass_rate", [0.2, 0.6, 0.9, 0.4], threshold=0.5)
    assert passed.value == 0.5 and 0.0 <= passed.low < 0.5 < passed.high <= 1.0
    custom = score("statistics:median", [0.0, 1.0, 1.0, 0.2, 0.9])
    assert custom.value == 0.9 and custom.low <= 0.9 <= custom.high
    assert score("statistics:median", [0.0, 1.0, 1.0, 0.2, 0.9]) == custom, "the bootstrap is seeded"


def test_a_metric_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(MetricError, match=r"os\.path:basename raised TypeError"):
        score("os.path:basename", [1.0])  # it fails on a list: not a number either way
    with pytest.raises(MetricError, match="not a finite number"):
        score("builtins:str", [1.0])
    with pytest.raises(MetricError, match="no finished episode"):
        score("mean_reward", [])


def test_a_drop_beyond_the_threshold_is_a_regression() -> None:
    from rollout.evals.scoring import changes

    compared = changes({"a": 0.8, "b": 0.5, "c": 0.4}, {"a": 0.79, "b": 0.4, "c": 0.9}, max_drop=0.02)
    assert [(c.environment, c.regressed) for c in compared] == [("a", False), ("b", True), ("c", False)]
    assert round(compared[1].change, 6) == -0.1
