"""The small values workflows and activities pass each other: ids, names, numbers, and an environment's own
seat and sandbox records (rollout.environment's `AgentSeatSpec`, `SandboxSpec`). Never transcripts or
tensors.

Every id here is a business key computed in workflow code (run, episode, group, agent, attempt), so an
activity retried by Temporal writes the same ledger keys as the attempt before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout import defaults
from rollout.environment import AgentSeatSpec, SandboxSpec
from rollout.launches import RunLaunch
from rollout.records import Payload
from rollout.rl.advantages import AdvantageKind
from rollout.run_settings import max_lag_of
from rollout.workflows.names import RUNNER_QUEUE, TRAINER_QUEUE


def run_policy(run: str, policy: str) -> str:
    """A policy as the ledger names it: each run trains its own lineage (`{run}/{policy}`), so two runs that
    both train "default" never share checkpoints or staleness bounds."""
    return f"{run}/{policy}"


@dataclass
class SandboxGrant:
    """A claimed sandbox: where it is and the claim's epoch (the fence its agents act under)."""

    kind: str
    name: str
    address: str
    epoch: int
    holder: str


@dataclass
class ClaimInput:
    run: str
    episode: str
    need: SandboxSpec


@dataclass
class EnvironmentInfo:
    """What workflow code needs to know about an environment (found by an activity that imports it): its seats
    and its sandbox are the environment's own records."""

    reference: str
    name: str
    agents: list[AgentSeatSpec]
    group_size: int
    max_turns: int
    replayable: bool
    sandbox: SandboxSpec | None = None
    tasks: str = "train"  # which of its task sources episodes draw from: train, eval (held out), seed:N

    def external_model_settings(self) -> dict[str, str]:
        """The run settings naming the policies an external model answers (`external_model/POLICY`), which the
        gateway reads to answer their seats."""
        return {
            f"{defaults.EXTERNAL_MODEL_SETTING}{a.policy}": a.model
            for a in self.agents
            if a.model is not None
        }


@dataclass
class AgentInput:
    run: str
    episode: str
    group: int
    environment: EnvironmentInfo
    agent: AgentSeatSpec
    sandbox: SandboxGrant | None = None
    sandbox_seat: int = 0


@dataclass
class AgentAttempt:
    """One try at playing an agent's seat. A replayable environment keeps the seat across tries."""

    input: AgentInput
    attempt: int
    seat: str


@dataclass
class AgentResult:
    agent: str
    seat: str
    reward: float
    turns: int
    attempts: int = 1
    truncated: bool = False
    metrics: dict[str, float] = field(default_factory=dict[str, float])
    untrained: list[str] = field(default_factory=list[str])  # segments the environment keeps out of training


@dataclass
class EpisodeInput:
    run: str
    episode: str
    group: int
    environment: EnvironmentInfo


@dataclass
class EpisodeResult:
    run: str
    episode: str
    group: int
    finished: bool
    rewards: dict[str, float] = field(default_factory=dict[str, float])
    error: str | None = None


@dataclass
class SupplyCounts:
    """What an `EpisodeSupplyWorkflow` has played since the run began (its result, and its `counts` query)."""

    groups_finished: int = 0  # groups every episode of which has ended (finished or failed)
    episodes_finished: int = 0
    episodes_failed: int = 0
    groups_in_flight: int = 0  # groups started and not yet finished (0 in its result: it waits for them)


@dataclass
class SupplyInput:
    """An `EpisodeSupplyWorkflow`'s start; when it continues as new, `next_group`, `paused`, `allowance` and
    `played` carry its state over."""

    run: str
    environment: EnvironmentInfo
    groups_in_flight: int = defaults.GROUPS_IN_FLIGHT
    max_groups: int | None = None  # None: until the run stops
    next_group: int = 0
    paused: bool = False
    # groups it may have started in all (a training run's staleness bound); None: no bound
    allowance: int | None = None
    played: SupplyCounts = field(default_factory=SupplyCounts)  # what it played before this history


@dataclass
class RunInput:
    run: str
    environment: str
    groups_in_flight: int = defaults.GROUPS_IN_FLIGHT
    max_groups: int | None = None
    max_lag: int = defaults.MAX_LAG
    settings: dict[str, bool | int | float | str] = field(default_factory=dict[str, bool | int | float | str])
    training: TrainingSpec | None = None
    launch: RunLaunch | None = None  # how `rollout train` launched it, recorded as an event of its own

    def __post_init__(self) -> None:
        max_lag_of(self.max_lag)  # a run that admits no turn is refused before it starts


@dataclass
class RunStatus:
    """A run's state (`RunWorkflow.status`, and its result). The episode and group counts are the supply's
    (`SupplyCounts`), known once it has ended: 0 while it plays."""

    run: str
    paused: bool
    stopped: bool
    max_lag: int
    episodes_finished: int
    episodes_failed: int
    groups_finished: int
    pause_reason: str | None = None
    trained: dict[str, str | None] = field(
        default_factory=dict[str, str | None]
    )  # policy -> newest checkpoint


@dataclass
class SettingsChange:
    run: str
    key: str  # the business key of this change (its update id)
    changes: dict[str, bool | int | float | str]


@dataclass
class AbandonInput:
    attempt: AgentAttempt
    reason: str


@dataclass
class EpisodeRecord:
    result: EpisodeResult
    environment: str
    seats: dict[str, str] = field(default_factory=dict[str, str])
    turns: dict[str, int] = field(default_factory=dict[str, int])
    metrics: dict[str, dict[str, float]] = field(default_factory=dict[str, dict[str, float]])
    sandbox: str | None = None  # the claimed sandbox, kind/name@epoch
    untrained: dict[str, list[str]] = field(default_factory=dict[str, list[str]])  # by agent: segment ids


def episode_record(
    given: EpisodeInput, results: list[AgentResult], errors: list[str], *, sandbox: str | None = None
) -> EpisodeRecord:
    """What `record_episode` records of an episode whose agents gave `results` and failed with `errors`."""
    result = EpisodeResult(
        given.run,
        given.episode,
        given.group,
        finished=not errors,
        rewards={r.agent: r.reward for r in results},
        error="; ".join(errors) or None,
    )
    return EpisodeRecord(
        result,
        given.environment.reference,
        seats={r.agent: r.seat for r in results},
        turns={r.agent: r.turns for r in results},
        metrics={r.agent: r.metrics for r in results},
        untrained={r.agent: r.untrained for r in results if r.untrained},
        sandbox=sandbox,
    )


@dataclass
class AssembleInput:
    """Which batch to assemble: the run, the policy it trains, the step (the batch's business key)."""

    run: str
    policy: str
    step: int
    group_size: int
    groups_per_batch: int = 2
    advantage: AdvantageKind = AdvantageKind.group_norm


@dataclass
class BatchInfo(Payload):
    """A `BatchAssembled` record: exactly the episodes (of whole groups) a step consumes."""

    run: str
    policy: str
    step: int
    groups: list[int]
    episodes: list[str]
    trained_episodes: list[str]
    skipped_groups: int
    sampled_tokens: int  # 0: every group was skipped for having no signal, and the step trains nothing
    reward_mean: float
    reward_std: float


@dataclass
class BatchLookup:
    """What `assemble_batch` found for a step: its batch, or None while no whole group is ready."""

    batch: BatchInfo | None = None


@dataclass
class TrainStepInput:
    run: str
    policy: str
    step: int
    batch: BatchInfo
    parent: str | None  # the checkpoint this step trains from; None for the base model
    advantage: AdvantageKind = AdvantageKind.group_norm


@dataclass
class CheckpointInfo:
    name: str
    version: int
    parent: str | None
    metrics: dict[str, float] = field(default_factory=dict[str, float])


@dataclass
class TrainingInput:
    """One policy's training in a run: the run's `TrainingSpec`, and where this workflow starts from."""

    run: str
    policy: str
    group_size: int
    spec: TrainingSpec
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
class TrainingSpec:
    """How a run trains: `RunWorkflow` starts one `TrainingWorkflow` per trained policy with these
    settings."""

    steps: int
    groups_per_batch: int = 2
    advantage: AdvantageKind = AdvantageKind.group_norm
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


@dataclass
class BridgeInput:
    run: str
    policy: str
    checkpoint: str
    version: int
    format: str  # lora, full or merged


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
class EvalInput:
    """Score suite `suite@version` on `checkpoint` (`base`, a checkpoint's name, or `latest:RUN/POLICY`)."""

    suite: str
    version: str
    suite_hash: str
    environments: list[EvalTarget]
    checkpoint: str
    groups_in_flight: int = 4
    served_wait_s: float = 600.0
    default_max_tokens: int | None = None  # for environments whose suite sets no max_tokens (run.max_tokens)
    # A checkpoint with no serving target yet (an SFT adapter) is bridged to these formats on this queue
    # first.
    bridge_formats: list[str] = field(default_factory=lambda: ["lora"])
    bridge_queue: str = TRAINER_QUEUE


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
class EvalRecordInput:
    """Score the episodes of `run` (one environment of an eval) and record the `EvalResult`."""

    suite: str
    version: str
    suite_hash: str
    checkpoint: CheckpointChoice
    target: EvalTarget
    run: str


@dataclass
class EvalLookup:
    suite: str
    version: str
    checkpoint: str
    environment: str


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
class EvalOutcome:
    suite: str
    version: str
    checkpoint: str
    scores: list[EvalScore] = field(default_factory=list[EvalScore])
