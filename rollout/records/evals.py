"""The eval records in the ledger: a suite version registered (`SuiteRegistered`, on `evals/suites`, keyed
`name@version`), each environment's score for one checkpoint under one suite version (`EvalResult`, on
`evals/{suite}/results`, keyed `result_key(…)`), and what a gate decided for one checkpoint (`GateDecision`,
on `evals/{suite}/gates`). Pure data: rollout.evals records and reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollout.records import Payload


@dataclass(frozen=True)
class SuiteRegistered(Payload):
    """A suite's declaration as registered (rollout.evals.suites reads it back as its `Suite`, checking
    every field), and the hash of its content."""

    suite: dict[str, Any]
    content_hash: str


@dataclass(frozen=True)
class EvalResult(Payload):
    """One environment's score for one checkpoint under one suite version."""

    suite: str
    version: str
    suite_hash: str
    checkpoint: str  # the checkpoint's name (`base` for the base model)
    checkpoint_version: int  # its step in its lineage (0 for the base model)
    policy: str | None  # the ledger policy it belongs to (None for the base model)
    environment: str  # the suite's name for the environment
    reference: str  # package.module:attribute
    metric: str
    score: float
    low: float  # 95% confidence interval
    high: float
    episodes: int  # finished episodes scored
    failed: int  # episodes that failed (not scored)
    run: str  # the eval's run: its episodes and transcripts are under it
    seats: list[str] = field(default_factory=list[str])  # every scored seat: `rollout ledger tail seat/SEAT`

    @property
    def key(self) -> str:
        return result_key(self.version, self.checkpoint, self.environment)


def result_key(version: str, checkpoint: str, environment: str) -> str:
    return f"{version}/{checkpoint}/{environment}"


@dataclass(frozen=True, kw_only=True)
class GateDecision(Payload):
    """What a gate decided for one checkpoint on one suite version."""

    suite: str
    version: str
    checkpoint: str
    lineage: str  # the ledger policy (`{run}/{policy}`) whose checkpoints were compared
    tripped: bool
    action: str  # rollout.config.GateAction's value: pause, rollback, warn
    max_drop: float
    reason: str  # why it tripped, in a sentence ("" when it did not)
    best: str | None = None  # the best earlier checkpoint where it tripped: what `rollback` trains from
    decided_by: str = ""  # the Temporal run of the eval that recorded it

    @property
    def key(self) -> str:
        return f"{self.version}/{self.checkpoint}"
