"""The records of the episode workflows (rollout.workflows.episodes: `EpisodeSupplyWorkflow`,
`EpisodeWorkflow`, `AgentWorkflow`) and of the runner's activities they call (rollout.workflows.runner_stubs):
the environment as workflow code knows it (`EnvironmentInfo`, which `describe_environment` also gives the run
and the preflight), a claimed sandbox, an agent's seat and attempts, an episode's result and record, the
supply's start and counts.

A workflow's records live in a module of their own beside it, all in one place, not in the workflow's
module: the activity stubs carry most of them, the workflow's module imports the stubs, and a stubs module
cannot import the workflow that calls it.

Contract: small values only (ids, names, numbers, and rollout.environment's seat and sandbox records), never
transcripts or tensors; each round-trips through Temporal's default (JSON) data converter. Every id here is a
business key computed in workflow code (run, episode, group, agent, attempt), so an activity retried by
Temporal writes the same ledger keys as the attempt before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.config import defaults
from rollout.environment import AgentSeatSpec, SandboxSpec
from rollout.run.failures import Failure


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

    def external_models(self) -> dict[str, str]:
        """The policies an external model answers, with their models (`RunSettings.external_models`), which
        the gateway reads to answer their seats."""
        return {a.policy: a.model for a in self.agents if a.model is not None}


@dataclass
class SandboxGrant:
    """A claimed sandbox: where it is and the claim's epoch (the fence its agents act under)."""

    kind: str
    name: str
    address: str
    epoch: int
    holder: str
    # The id of the episode workflow that claimed it: only that workflow renews or releases the claim, and
    # only it or its agents' workflows play in it (while it runs, Temporal starts no other workflow with its
    # id), so a grant copied out of its history cannot end the claim early or act in another's sandbox.
    workflow_id: str = ""
    # The claiming runner's rollout.sandbox.keys.grant_signature: runners act only on a grant it holds for.
    signature: str = ""


@dataclass
class ClaimInput:
    run: str
    episode: str
    need: SandboxSpec


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
class PinRequest:
    """The seats of an episode pinned relative to their policy's lineage (rollout.run.pins), to resolve."""

    run: str
    episode: str
    agents: list[AgentSeatSpec]


@dataclass
class PinnedSeat:
    """The checkpoint a relative pin resolved to for one episode, and the fallback it took, if any."""

    agent: str
    pin: str
    checkpoint: str
    fallback: str | None = None

    def summary(self) -> str:
        return self.checkpoint if self.fallback is None else f"{self.checkpoint} ({self.fallback})"


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
class AbandonInput:
    attempt: AgentAttempt
    reason: str


@dataclass
class EpisodeInput:
    run: str
    episode: str
    group: int
    environment: EnvironmentInfo
    pinned: list[PinnedSeat] = field(default_factory=list[PinnedSeat])  # its relative pins, once resolved


@dataclass
class EpisodeResult:
    run: str
    episode: str
    group: int
    finished: bool
    rewards: dict[str, float] = field(default_factory=dict[str, float])
    error: str | None = None


@dataclass
class EpisodeRecord:
    result: EpisodeResult
    environment: str
    seats: dict[str, str] = field(default_factory=dict[str, str])
    turns: dict[str, int] = field(default_factory=dict[str, int])
    metrics: dict[str, dict[str, float]] = field(default_factory=dict[str, dict[str, float]])
    sandbox: str | None = None  # the claimed sandbox, kind/name@epoch
    untrained: dict[str, list[str]] = field(default_factory=dict[str, list[str]])  # by agent: segment ids
    failure: Failure | None = None  # the first of its agents' failures, if one failed
    pinned: dict[str, str] = field(default_factory=dict[str, str])  # by agent: the checkpoint a pin played


def episode_record(
    given: EpisodeInput, results: list[AgentResult], failures: list[Failure], *, sandbox: str | None = None
) -> EpisodeRecord:
    """What `record_episode` records of an episode whose agents gave `results` and failed with `failures`."""
    result = EpisodeResult(
        given.run,
        given.episode,
        given.group,
        finished=not failures,
        rewards={r.agent: r.reward for r in results},
        error="; ".join(f.summary for f in failures) or None,
    )
    return EpisodeRecord(
        result,
        given.environment.reference,
        seats={r.agent: r.seat for r in results},
        turns={r.agent: r.turns for r in results},
        metrics={r.agent: r.metrics for r in results},
        untrained={r.agent: r.untrained for r in results if r.untrained},
        sandbox=sandbox,
        failure=failures[0] if failures else None,
        pinned={p.agent: p.summary() for p in given.pinned},
    )


@dataclass
class SupplyCounts:
    """What an `EpisodeSupplyWorkflow` has played since the run began (its result, and its `counts` query)."""

    groups_finished: int = 0  # groups every episode of which has ended (finished or failed)
    episodes_finished: int = 0
    episodes_failed: int = 0
    groups_in_flight: int = 0  # groups started and not yet finished (0 in its result: it waits for them)
    groups_failed: int = 0  # groups every episode of which failed: nothing to train on, beyond the allowance
    groups_straggling: int = (
        0  # of those in flight, stragglers: they no longer hold a slot of groups_in_flight
    )


@dataclass
class SupplyInput:
    """An `EpisodeSupplyWorkflow`'s start; when it continues as new, `next_group`, `paused`, `allowance`,
    `played`, `recent_failed` and `group_seconds` carry its state over."""

    run: str
    environment: EnvironmentInfo
    groups_in_flight: int = defaults.GROUPS_IN_FLIGHT
    max_groups: int | None = None  # None: until the run stops
    next_group: int = 0
    paused: bool = False
    # groups it may have started in all (a training run's staleness bound); None: no bound
    allowance: int | None = None
    played: SupplyCounts = field(default_factory=SupplyCounts)  # what it played before this history
    max_failure_rate: float = 1.0  # it pauses the run when more than this share of recent episodes failed
    failure_window: int = defaults.FAILURE_WINDOW
    recent_failed: list[bool] = field(default_factory=list[bool])  # the last episodes: failed or not
    # A group in flight longer than max(straggler_floor_s, straggler_factor × the median of `group_seconds`),
    # once `straggler_after` groups have finished, is a straggler: it plays on but holds no slot.
    straggler_floor_s: float = defaults.STRAGGLER_FLOOR_S
    straggler_factor: float = defaults.STRAGGLER_FACTOR
    straggler_after: int = defaults.STRAGGLER_AFTER
    group_seconds: list[float] = field(default_factory=list[float])  # how long the last groups took, in s


@dataclass(frozen=True)
class SupplyPaused:
    """`EpisodeSupplyWorkflow.set_paused`: whether new groups may start."""

    paused: bool


@dataclass(frozen=True)
class SupplyAllowance:
    """`EpisodeSupplyWorkflow.set_allowance`: how many groups may have started in all (rollout.rl.selection's
    supply allowance)."""

    allowance: int
