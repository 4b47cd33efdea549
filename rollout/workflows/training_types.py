"""The records of the training workflows (`TrainingWorkflow` in rollout.workflows.training, `BridgeWorkflow`
in rollout.workflows.bridges) and of the trainer's activities they call (rollout.workflows.trainer_stubs): how
a run trains (`TrainingSpec`, part of a run's `RunInput`), one policy's training, a step's batch and
checkpoint, a checkpoint's bridge to a serving format.

A workflow's records live in a module of their own beside it, all in one place, not in the workflow's
module: the activity stubs carry most of them, the workflow's module imports the stubs, and a stubs module
cannot import the workflow that calls it.

Contract: small values only (ids, names, numbers), never transcripts or tensors; each round-trips through
Temporal's default (JSON) data converter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.records.batches import BatchInfo
from rollout.workflows.eval_types import EvalInput
from rollout.workflows.names import RUNNER_QUEUE, TRAINER_QUEUE


@dataclass
class PolicyModel:
    """A policy on a base model or trainer settings of its own (`policies.NAME.*`, or its environment's
    `policy_models`): its trainer builds this model with these settings, its bridges merge onto it, and only
    engines serving this model serve its checkpoints."""

    model: str  # the model's spec: smollm2, tiny-qwen3, a catalog model, an HF id or a local path
    lora_rank: int | None = None  # None: trainer.lora_rank
    learning_rate: float | None = None  # None: trainer.learning_rate
    # Where its training runs: a trainer worker of its own polls this queue (None: `TrainingSpec.task_queue`).
    task_queue: str | None = None


@dataclass
class TrainingSpec:
    """How a run trains: `RunWorkflow` starts one `TrainingWorkflow` per trained policy with these
    settings."""

    steps: int
    groups_per_batch: int = 2
    advantage: str = "group_norm"  # rollout.rl.advantages: a built-in name, or package.module:attribute
    # Refill (DAPO's dynamic sampling): a group whose rewards tie is replaced by a fresh one, at most
    # `refill_max` per step (None: twice groups_per_batch), so each step trains `groups_per_batch` groups with
    # signal.
    refill: bool = True
    refill_max: int | None = None
    serve_formats: list[str] = field(default_factory=lambda: ["lora"])
    wait_s: float = 1.0
    served_wait_s: float = 300.0  # how long the last step waits for an engine to serve its checkpoint
    task_queue: str = TRAINER_QUEUE
    heartbeat_s: float = 30.0  # a trainer silent this long is taken for dead: its step is retried elsewhere
    warm_start: str | None = None  # a checkpoint the first step trains from (an SFT adapter); None: the base
    evaluation: EvalInput | None = (
        None  # score every `eval_every`-th checkpoint on this suite (its checkpoint unset)
    )
    eval_every: int = 0
    # Policies on a model or trainer settings of their own, by policy name; the others train the trainer's.
    models: dict[str, PolicyModel] = field(default_factory=dict[str, PolicyModel])


@dataclass
class TrainingInput:
    """One policy's training in a run: the run's `TrainingSpec`, and where this workflow starts from."""

    run: str
    policy: str
    group_size: int
    spec: TrainingSpec
    # The agents whose seats train this policy (neither pinned nor answered by a model): refill judges a
    # group's signal by their rewards. None: every agent's.
    agents: list[str] | None = None
    next_step: int = 1
    parent: str | None = None  # the checkpoint the next step trains from (at first, the spec's warm start)
    skipped_steps: int = 0
    eval_queue: str = RUNNER_QUEUE  # where the evals play: the run's runner queue


@dataclass
class TrainingResult:
    run: str
    policy: str
    steps: int
    newest: str | None
    skipped_steps: int


@dataclass
class AssembleInput:
    """Which batch to assemble: the run, the policy it trains, the step (the batch's business key)."""

    run: str
    policy: str
    step: int
    group_size: int
    groups_per_batch: int = 2
    advantage: str = "group_norm"  # rollout.rl.advantages: a built-in name, or package.module:attribute
    refill_max: int | None = None  # tied groups a step may replace by fresh ones (None: refill off)
    agents: list[str] | None = None  # whose rewards say a group's signal (None: every agent's)


@dataclass
class BatchLookup:
    """What `assemble_batch` found for a step: its batch, or None while no whole batch is ready; and the
    groups this policy's steps have replaced so far (refill), a waiting step's set-aside ones included."""

    batch: BatchInfo | None = None
    replaced: int = 0


@dataclass
class TrainStepInput:
    run: str
    policy: str
    step: int
    batch: BatchInfo
    parent: str | None  # the checkpoint this step trains from; None for the base model
    advantage: str = "group_norm"  # rollout.rl.advantages: a built-in name, or package.module:attribute
    # The lineage's newest checkpoint when the step starts, what staleness is measured against: the parent,
    # unless an eval gate rolled training back to an older one (None: the parent).
    newest: str | None = None
    model: PolicyModel | None = None  # the policy's own model and settings (None: the trainer's)


@dataclass
class CheckpointInfo:
    name: str
    version: int
    parent: str | None
    metrics: dict[str, float] = field(default_factory=dict[str, float])


@dataclass
class BridgeInput:
    run: str
    policy: str
    checkpoint: str
    version: int
    format: str  # lora, full or merged
    model: str | None = None  # the policy's own base model (a spec), if it has one: merged onto, served by


@dataclass
class BridgeResult:
    format: str
    serving_format: str
    files: int
    location: str | None = None


@dataclass
class ServedWait:
    checkpoint: str
    timeout_s: float


@dataclass(frozen=True)
class RollbackAsked:
    """An eval's gate → `TrainingWorkflow`: the next step trains from `checkpoint`, for `reason`."""

    checkpoint: str
    reason: str


@dataclass
class TrainingPosition:
    """`TrainingWorkflow.progress` (a query): the step it is on and its newest checkpoint."""

    step: int
    newest: str | None
