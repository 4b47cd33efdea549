"""Scores: one number per environment from its episodes' rewards, with a 95% confidence interval.

Contract:
- `mean_reward` (the default): the mean; its interval is mean ± 1.96 standard errors (a single episode gives
  a zero-width interval).
- `pass_rate`: the fraction of episodes whose reward is at least `threshold`; Wilson's score interval.
- `package.module:function`: the function of the rewards (a list of floats) returns the score; its interval is
  the 2.5th to 97.5th percentile of the function over 1,000 bootstrap resamples drawn from a fixed seed, so a
  score recomputed from the same rewards is the same.
- A metric function that raises, or a score that is not a finite number, raises `MetricError` naming the
  metric; nothing is recorded for it.
- `changes(baseline, candidate, max_drop)` compares two checkpoints' scores environment by environment; a
  change below `-max_drop` is a regression (what `rollout eval compare` gates on).
- Pure: no I/O beyond importing a metric function.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollout.references import ReferenceLoadError, import_reference

METRICS = ("mean_reward", "pass_rate")
Z_95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 1000


class MetricError(ValueError):
    """A metric that cannot be computed: unknown, not importable, or not returning a finite number."""


@dataclass(frozen=True)
class Score:
    value: float
    low: float
    high: float
    episodes: int


def check_metric(metric: str, threshold: float) -> None:
    """`ValueError` when `metric` cannot name a metric (its function is imported only when scoring)."""
    if metric not in METRICS and ":" not in metric:
        raise ValueError(f"unknown metric {metric!r}: {', '.join(METRICS)}, or package.module:function")
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not math.isfinite(threshold):
        raise ValueError(f"`threshold` must be a number, not {threshold!r}")


def score(metric: str, rewards: Sequence[float], *, threshold: float = 1.0) -> Score:
    """The score of `rewards` under `metric`."""
    values = [float(r) for r in rewards]
    if not values:
        raise MetricError(f"metric {metric}: no finished episode to score")
    if metric == "mean_reward":
        return _mean(values)
    if metric == "pass_rate":
        return _wilson(sum(1 for r in values if r >= threshold), len(values))
    function = _function(metric)
    value = _call(metric, function, values)
    rng = random.Random(0)
    resampled = sorted(
        _call(metric, function, [rng.choice(values) for _ in values]) for _ in range(BOOTSTRAP_RESAMPLES)
    )
    low = resampled[int(0.025 * (BOOTSTRAP_RESAMPLES - 1))]
    high = resampled[int(0.975 * (BOOTSTRAP_RESAMPLES - 1))]
    return Score(value, min(low, value), max(high, value), len(values))


def _mean(values: list[float]) -> Score:
    mean = statistics.fmean(values)
    half = Z_95 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return Score(mean, mean - half, mean + half, len(values))


def _wilson(passed: int, n: int) -> Score:
    rate = passed / n
    z2 = Z_95 * Z_95
    centre = (rate + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_95 * math.sqrt(rate * (1 - rate) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Score(rate, max(0.0, centre - half), min(1.0, centre + half), n)


def _function(metric: str) -> Callable[[list[float]], object]:
    try:
        function = import_reference(metric, "metric function")
    except ReferenceLoadError as error:
        raise MetricError(f"metric {metric}: {error}") from None
    if not callable(function):
        raise MetricError(f"metric {metric} is a {type(function).__name__}, not a function of the rewards")
    return function


def _call(metric: str, function: Callable[[list[float]], object], rewards: list[float]) -> float:
    try:
        value = function(list(rewards))
    except Exception as error:
        raise MetricError(f"metric {metric} raised {type(error).__name__}: {error}") from error
    return _checked(metric, value)


def _checked(metric: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MetricError(f"metric {metric} returned {value!r}, not a finite number")
    return float(value)


@dataclass(frozen=True)
class Change:
    environment: str
    baseline: float
    candidate: float
    regressed: bool

    @property
    def change(self) -> float:
        return self.candidate - self.baseline


def changes(baseline: dict[str, float], candidate: dict[str, float], max_drop: float) -> list[Change]:
    """Each environment both were scored on, with whether the candidate dropped by more than `max_drop`."""
    return [
        Change(e, baseline[e], candidate[e], candidate[e] - baseline[e] < -max_drop)
        for e in sorted(baseline.keys() & candidate.keys())
    ]
