"""Evals: versioned suites of environments scored against any checkpoint (see docs/evals.md).

The public API: declare a `Suite` of `EvalEnvironment`s (or write it in YAML) and load it with `load_suite`;
`rollout eval register|run|schedule|results|compare` does the rest. The modules below are its parts:
`suites` (declarations), `scoring` (metrics and intervals), `records` (the ledger's suites and results),
`checkpoints` (which checkpoint a reference names).
"""

from rollout.evals.records import SuiteVersionTaken, UnknownSuite
from rollout.evals.scoring import MetricError, Score, score
from rollout.evals.suites import EvalEnvironment, Suite, SuiteError, load_suite
from rollout.records.evals import EvalResult

__all__ = [
    "EvalEnvironment",
    "EvalResult",
    "MetricError",
    "Score",
    "Suite",
    "SuiteError",
    "SuiteVersionTaken",
    "UnknownSuite",
    "load_suite",
    "score",
]
