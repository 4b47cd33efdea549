"""The runner's activities as workflow code sees them: typed stubs, called by reference, never run.

Workflow modules cannot import `rollout.activities.runner` (it imports psycopg, openai, the environments),
so they call these: `workflow.execute_activity(runner_stubs.create_run, given, ...)` takes the activity's name
and its argument and result types from the stub.

Contract:
- Each stub's function name is its activity's name on the wire (`@activity.defn` without a name), so renaming
  a stub renames the activity. `RunnerActivities` (rollout.activities.runner) implements every stub under the
  stub's name (`@activity.defn(name=runner_stubs.play_agent.__name__)`) with the same parameter and return
  types, and the runner worker (rollout.workers.runner) registers each exactly once on `RUNNER_QUEUE`;
  tests/test_temporal_stubs.py checks both.
- A stub's body never runs: it raises `NotImplementedError`. Its docstring is the activity's contract.
"""

from __future__ import annotations

from temporalio import activity

from rollout.workflows.episode_types import (
    AbandonInput,
    AgentAttempt,
    AgentResult,
    ClaimInput,
    EnvironmentInfo,
    EpisodeRecord,
    EpisodeResult,
    PinnedSeat,
    PinRequest,
    SandboxGrant,
)
from rollout.workflows.eval_types import (
    CheckpointChoice,
    EvalLookup,
    EvalRecordInput,
    EvalScore,
    GateInput,
    GateOutcome,
    ServingHold,
)
from rollout.workflows.run_types import RunInput, SettingsChange
from rollout.workflows.tracking_types import TrackingInput, TrackingState


@activity.defn
async def describe_environment(reference: str) -> EnvironmentInfo:
    """Load the environment `reference` (package.module:attribute) and describe what workflow code needs: its
    agents, group size, turns, replayability and sandbox need. A reference that does not load fails for good
    (`EnvironmentLoadError`)."""
    raise NotImplementedError


@activity.defn
async def create_run(run: RunInput) -> None:
    """Record `RunCreated` on `run/{run}` with the run's settings (max_lag, paused and the given ones),
    once."""
    raise NotImplementedError


@activity.defn
async def change_settings(change: SettingsChange) -> None:
    """Record `SettingsChanged` on `run/{run}` under the change's key (its update's id): a retry records
    once."""
    raise NotImplementedError


@activity.defn
async def resolve_pins(request: PinRequest) -> list[PinnedSeat]:
    """The checkpoint each relative-pinned seat of the episode plays (rollout.run.pins), from its policy's
    served lineage in the ledger; a seat this episode already opened keeps the checkpoint it opened with."""
    raise NotImplementedError


@activity.defn
async def play_agent(attempt: AgentAttempt) -> AgentResult:
    """Open the attempt's seat and play the agent's task through the gateway (or its external command),
    heartbeating; return its reward and turns. A retry of a replayable seat resumes by replay. Fails for good
    (not retried) with an error typed by its deterministic `Failure` kind (rollout.run.failures), the record
    in its details."""
    raise NotImplementedError


@activity.defn
async def play_episode(attempt: AgentAttempt) -> EpisodeResult:
    """A one-seat episode with a replayable environment and no sandbox, in one activity: `play_agent`, then
    `record_episode` of its result; returns the episode's result. A retry resumes the play by replay and
    records once. A failure (for good, or after the retries) records nothing: the workflow records the episode
    abandoned."""
    raise NotImplementedError


@activity.defn
async def abandon_attempt(abandon: AbandonInput) -> None:
    """Record a failed attempt as `EpisodeAbandoned` (never trained) and close its seat; once per attempt."""
    raise NotImplementedError


@activity.defn
async def record_episode(record: EpisodeRecord) -> None:
    """Record the episode's end (`EpisodeFinished`, or `EpisodeAbandoned` with its error) on
    `run/{run}/episodes` and close its seats; once per episode."""
    raise NotImplementedError


@activity.defn
async def claim_sandbox(given: ClaimInput) -> SandboxGrant:
    """Claim a sandbox of the need's kind for the episode (holder `{run}/{episode}`, idempotent by holder),
    waiting up to the need's `wait_s`, and open it under the claim's epoch. None free in time fails for good
    (`NoSandboxFree`)."""
    raise NotImplementedError


@activity.defn
async def renew_sandbox(grant: SandboxGrant, ttl_s: float) -> bool:
    """Extend the claim by `ttl_s`; False when it was lost (it expired and another episode claimed it)."""
    raise NotImplementedError


@activity.defn
async def release_sandbox(grant: SandboxGrant) -> None:
    """Free the claimed sandbox (a claim already released or lost changes nothing)."""
    raise NotImplementedError


@activity.defn
async def resolve_checkpoint(reference: str) -> CheckpointChoice:
    """The checkpoint `reference` names now (`base`, a name, `latest:RUN/POLICY`, rollout.evals.checkpoints).
    Nothing recorded under it fails for good (`UnknownCheckpoint`, naming the closest ones)."""
    raise NotImplementedError


@activity.defn
async def hold_serving(hold: ServingHold) -> None:
    """Ask the engines to serve the checkpoint for `holder` (`ServingRequested`, once) and wait, heartbeating,
    until one serves it. Fails for good when it has no serving target (`CheckpointNotServable`) or no engine
    serves it within `wait_s` (`NotServed`)."""
    raise NotImplementedError


@activity.defn
async def release_serving(hold: ServingHold) -> None:
    """Tell the engines `holder` no longer needs the checkpoint (`ServingReleased`, once)."""
    raise NotImplementedError


@activity.defn
async def find_eval_result(lookup: EvalLookup) -> EvalScore | None:
    """The recorded score of (suite@version, checkpoint, environment), if there is one."""
    raise NotImplementedError


@activity.defn
async def record_eval_result(given: EvalRecordInput) -> EvalScore:
    """Score the finished episodes of the eval's run with the environment's metric and record the
    `EvalResult`, once per (suite@version, checkpoint, environment): a retry or a repeat returns the recorded
    score. A metric that does not give a finite number fails for good (`InvalidMetric`), recording nothing."""
    raise NotImplementedError


@activity.defn
async def decide_eval_gate(given: GateInput) -> GateOutcome:
    """Judge the checkpoint's recorded scores against the best earlier checkpoint of its lineage on the same
    suite version, and record the decision once (rollout.evals.gates.decide): `act` is true only for the eval
    that recorded it (this one, or an earlier attempt of it), never for a repeated eval of the checkpoint."""
    raise NotImplementedError


@activity.defn
async def feed_tracking(given: TrackingInput) -> TrackingState:
    """Log the run's step, eval and sample records to its tracking backends, each record once and in order,
    from where each backend says it is, until the run has ended and all are logged (rollout.tracking.feed). A
    backend that refuses is retried with a bound and reported in the heartbeat's `TrackingState`; it never
    fails the activity. Returns the backends' last state."""
    raise NotImplementedError
