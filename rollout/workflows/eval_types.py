"""The records of `EvalWorkflow` (rollout.workflows.evals) and of the runner's activities it calls
(rollout.workflows.runner_stubs): a suite to score on a checkpoint (`EvalInput`, which a run's `TrainingSpec`
also names), the checkpoint resolved and held served, each environment's score, and what the eval returns.

A workflow's records live in a module of their own beside it, all in one place, not in the workflow's
module: the activity stubs carry most of them, the workflow's module imports the stubs, and a stubs module
cannot import the workflow that calls it.

Contract: small values only (ids, names, numbers), never transcripts or tensors; each round-trips through
Temporal's default (JSON) data converter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.config import defaults
from rollout.workflows.names import TRAINER_QUEUE


@dataclass
class EvalTarget:
    """One environment of an eval suite, as `EvalWorkflow` plays and scores it
    (rollout.evals.EvalEnvironment)."""

    name: str
    reference: str
    episodes: int
    tasks: str = "eval"
    first: int = 0
    temperature: float = 0.0
    max_tokens: int | None = None
    metric: str = "mean_reward"
    threshold: float = 1.0


@dataclass
class EvalGate:
    """After the eval, compare the checkpoint with the best earlier one of its lineage (rollout.evals.gates);
    on a drop beyond `max_drop`, take `action` (pause, rollback, warn) on run `run`'s `policy`, once."""

    max_drop: float
    action: str  # rollout.config.GateAction's value
    run: str = ""  # the training run, and its policy's name: `TrainingWorkflow` fills them in
    policy: str = ""


@dataclass
class GateInput:
    """Decide `gate` for `checkpoint` of `lineage` on `suite@version`; `decided_by`: the eval's run."""

    suite: str
    version: str
    checkpoint: str
    lineage: str
    gate: EvalGate
    decided_by: str


@dataclass
class GateOutcome:
    """The gate's decision for a checkpoint, and whether this eval acts on it (it recorded it)."""

    tripped: bool
    reason: str
    best: str | None
    act: bool


@dataclass
class EvalInput:
    """Score suite `suite@version` on `checkpoint` (`base`, a checkpoint's name, or `latest:RUN/POLICY`)."""

    suite: str
    version: str
    suite_hash: str
    environments: list[EvalTarget]
    checkpoint: str
    # At most this many of the eval's episodes play at once, across all its environments (`eval_lanes`).
    episodes_in_flight: int = defaults.EVAL_EPISODES_IN_FLIGHT
    served_wait_s: float = 600.0
    default_max_tokens: int | None = None  # for environments whose suite sets no max_tokens (run.max_tokens)
    # A checkpoint with no serving target yet (an SFT adapter) is bridged to these formats on this queue
    # first.
    bridge_formats: list[str] = field(default_factory=lambda: ["lora"])
    bridge_queue: str = TRAINER_QUEUE
    gate: EvalGate | None = None  # a training run's eval: what a drop in score does to the run


@dataclass
class EvalScore:
    """One environment's score, as `EvalWorkflow` returns it (the ledger's `EvalResult` has every field)."""

    environment: str
    score: float
    low: float
    high: float
    episodes: int
    failed: int
    run: str


@dataclass
class EvalLookup:
    suite: str
    version: str
    checkpoint: str
    environment: str


@dataclass
class EvalRecordInput:
    """Score the episodes of `run` (one environment of an eval) and record the `EvalResult`."""

    suite: str
    version: str
    suite_hash: str
    checkpoint: CheckpointChoice
    target: EvalTarget
    run: str


@dataclass
class CheckpointChoice:
    """The checkpoint an eval scores, resolved (rollout.evals.checkpoints.ChosenCheckpoint)."""

    name: str
    policy: str | None
    version: int
    formats: list[str] = field(default_factory=list[str])
    run: str = ""  # the run that made it ("" for the base model)


@dataclass
class ServingHold:
    """`holder` needs `checkpoint` served (requested, waited for up to `wait_s`, released)."""

    holder: str
    checkpoint: str
    wait_s: float = 600.0


@dataclass
class EvalOutcome:
    suite: str
    version: str
    checkpoint: str
    scores: list[EvalScore] = field(default_factory=list[EvalScore])
