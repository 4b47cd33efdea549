"""Episode workflows: one agent's play, one episode, and the supply that keeps episode groups in flight.

Deterministic workflow code only: activities are called through their typed stubs
(rollout.workflows.runner_stubs: nothing heavy is imported here), child workflows by their run methods, and
every id is a business key built from run, episode, group, agent and attempt (rollout.workflows.names).

Contract:
- `AgentWorkflow` (`run/{run}/ep/{episode}/agent/{name}`) plays one seat of a multi-agent episode; a one-seat
  episode plays its seat inline, with the same code (`play_seat`), so the same guarantees hold. A one-seat
  episode of a replayable environment with no sandbox plays and records in one activity (`play_episode`, one
  workflow task fewer); if that fails, the episode is recorded abandoned as any other. A replayable
  environment keeps one seat and lets Temporal retry the play activity on any runner (a dead runner is noticed
  by its heartbeat); the retry resumes by replay. A non-replayable one plays each attempt on a fresh seat: a
  failed attempt is recorded as abandoned (never trained) and a new one starts.
- `EpisodeWorkflow` (`run/{run}/ep/{episode}`) first claims the environment's sandbox, if it needs one
  (waiting up to the need's `wait_s`; none free in time fails the episode with the reason), renews the claim
  every third of its time to live while the agents play, and releases it at the end, however the episode
  ended. It plays every agent seat at once (agent i on sandbox seat i), gathers their rewards and records the
  episode: `EpisodeFinished`, or `EpisodeAbandoned` with the error and the first `Failure`
  (rollout.run.failures: its kind, reason and place in the environment's code) when an agent failed for good.
  A deterministic failure is never retried. It never fails itself, so the run goes on.
- Seats pinned relative to their policy's lineage (`latest`, `latest-K`, `sample`, `sample-N`:
  rollout.run.pins) are resolved first, once, by the `resolve_pins` activity (so a replay, a retried seat and
  a restarted episode play the same checkpoints); each chosen checkpoint but the base model is held on the
  engines (`hold_serving`, holder the episode's workflow id) until the episode ends, and a hold that fails
  abandons the episode with the reason. The episode's record names what each pinned seat played (`pinned`).
- A seat played by an external command is never replayed (the command's requests are not ours to repeat):
  each attempt gets a fresh seat, like a non-replayable environment.
- `EpisodeSupplyWorkflow` (`run/{run}/supply`) keeps `groups_in_flight` groups of `group_size` episodes
  running, from group index `next_group` on; while paused it starts none, nor group `allowance` and beyond (a
  training run raises its allowance as steps are trained: `set_allowance`; groups whose every episode failed
  are not counted, as no step trains on them). It stops when told to (`stop`),
  or after `max_groups`, once the groups in flight have finished, and returns what it played (`SupplyCounts`,
  also its `counts` query); it continues as new every `GROUPS_PER_HISTORY` groups, when none are in flight,
  carrying its counts. When more than `max_failure_rate` of its last `failure_window` episodes failed, it
  pauses itself and tells its run (`EPISODES_FAILING`, with the count and the latest failure), which pauses
  with that reason; resuming counts afresh. Episodes that end after `stop` are not counted.
- Stragglers: a group in flight longer than `straggler_floor_s`, or `straggler_factor` × the median time of
  the run's last finished groups if that is longer (once `straggler_after` have finished), stops counting
  against `groups_in_flight` and against the allowance, so a hung environment call does not starve the
  supply: other groups start beside it. It plays on and ends by its own bound (`Environment.turn_timeout_s`),
  recorded with its reason as any other (should it finish after all, a later step trains it, further behind
  than max_lag: its staleness is measured as every step's is). At most `groups_in_flight` stragglers are let
  off at once. Time is the workflow's
  (`workflow.now()`, a timer to the next group's deadline), so a replay decides the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from rollout.run.failures import DETERMINISTIC, KINDS, TRANSIENT, Failure, one_line
from rollout.workflows import runner_stubs
from rollout.workflows.episode_types import (
    AbandonInput,
    AgentAttempt,
    AgentInput,
    AgentResult,
    ClaimInput,
    EpisodeInput,
    EpisodeResult,
    PinRequest,
    SandboxGrant,
    SupplyAllowance,
    SupplyCounts,
    SupplyInput,
    SupplyPaused,
    episode_record,
)
from rollout.workflows.eval_types import ServingHold
from rollout.workflows.names import agent_workflow_id, episode_id, episode_workflow_id
from rollout.workflows.options import QUICK, heartbeating
from rollout.workflows.run_types import PauseAsked
from rollout.workflows.signals import RunSignals

PLAY_HEARTBEAT = timedelta(seconds=10)
PLAY_TIMEOUT = timedelta(hours=6)
FRESH_ATTEMPTS = 3  # attempts of a non-replayable agent before the episode fails
# A replayable agent's attempts: each dead runner costs one (an outage of the gateway or the ledger is ridden
# out inside an attempt), so these outlast a runner restarted several times during one episode.
REPLAY_ATTEMPTS = 10
GROUPS_PER_HISTORY = 100
FOR_GOOD = list(DETERMINISTIC)  # failures a retry would repeat (rollout.run.failures)
# How long an episode waits for the engines to serve a checkpoint a self-play pin chose (rollout.run.pins).
PIN_SERVED_WAIT_S = 300.0
BASE = "base"  # the base model: every engine serves it, nothing to hold
# Workflows started before one-seat episodes played and recorded in one activity replay the old commands.
PLAY_AND_RECORD = "play-and-record"
# Supplies started before stragglers were let off their slot replay without the timer that notices them.
STRAGGLERS = "stragglers"
GROUP_SECONDS_KEPT = 100  # the finished groups' times a supply keeps for its median


def _cause(error: BaseException) -> BaseException:
    cause = error.__cause__ or error
    while isinstance(cause, (ActivityError, ChildWorkflowError)) and cause.__cause__ is not None:
        cause = cause.__cause__
    return cause


def _reason(error: BaseException) -> str:
    cause = _cause(error)
    return str(cause) or type(cause).__name__


def _failure(error: BaseException) -> Failure:
    """How an agent failed: the `Failure` its activity classified (in the error's details), or a transient
    failure that outlasted its retries (a dead runner, an outage)."""
    cause = _cause(error)
    if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
        given = cast(dict[str, Any], cause.details[0])
        if given.get("kind") in KINDS and isinstance(given.get("reason"), str):
            where, detail, seat = given.get("where"), given.get("detail"), given.get("seat")
            return Failure(
                kind=given["kind"],
                reason=given["reason"],
                where=where if isinstance(where, str) else None,
                detail=detail if isinstance(detail, str) else "",
                seat=seat if isinstance(seat, str) else None,
            )
    return Failure(TRANSIENT, one_line(_reason(error)))


def _play_retry(replayable: bool) -> RetryPolicy:
    return RetryPolicy(
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=REPLAY_ATTEMPTS if replayable else 1,
        non_retryable_error_types=FOR_GOOD,
    )


def _seat(given: AgentInput) -> str:
    return f"{given.run}/{given.episode}/{given.agent.name}"


async def play_seat(given: AgentInput) -> AgentResult:
    """One agent's play, with its attempts (workflow code: runs in `AgentWorkflow`, or inline in a one-seat
    episode's `EpisodeWorkflow`)."""
    seat = _seat(given)
    # A seat naming a command (a non-empty `AgentSeatSpec.command`) plays its own loop: never replayed.
    replayable = given.environment.replayable and not given.agent.command
    attempts = 1 if replayable else FRESH_ATTEMPTS
    for attempt in range(1, attempts + 1):
        try_ = AgentAttempt(given, attempt, seat if replayable else f"{seat}/a{attempt}")
        try:
            return await workflow.execute_activity(
                runner_stubs.play_agent,
                try_,
                start_to_close_timeout=PLAY_TIMEOUT,
                heartbeat_timeout=PLAY_HEARTBEAT,
                retry_policy=_play_retry(replayable),
            )
        except ActivityError as error:
            cause = error.cause
            if replayable or (isinstance(cause, ApplicationError) and cause.type in FOR_GOOD):
                raise
            await workflow.execute_activity(
                runner_stubs.abandon_attempt, AbandonInput(try_, _reason(error)), **QUICK
            )
    raise ApplicationError(f"agent {given.agent.name} failed {attempts} fresh attempts", type="AgentGaveUp")


def _agent_inputs(given: EpisodeInput, grant: SandboxGrant | None) -> list[AgentInput]:
    return [
        AgentInput(
            run=given.run,
            episode=given.episode,
            group=given.group,
            environment=given.environment,
            agent=agent,
            sandbox=grant,
            sandbox_seat=seat,
        )
        for seat, agent in enumerate(given.environment.agents)
    ]


@workflow.defn(name="AgentWorkflow")
class AgentWorkflow:
    @workflow.run
    async def run(self, given: AgentInput) -> AgentResult:
        return await play_seat(given)


@workflow.defn(name="EpisodeWorkflow")
class EpisodeWorkflow:
    @workflow.run
    async def run(self, given: EpisodeInput) -> EpisodeResult:
        if any(agent.relative_pin is not None for agent in given.environment.agents):
            return await self._play_pinned(given)
        return await self._play(given)

    async def _play_pinned(self, given: EpisodeInput) -> EpisodeResult:
        """Resolve the episode's self-play pins once (an activity: its result is in the history, so a replay
        or a retried seat plays the same checkpoints), hold each chosen checkpoint on the engines while the
        episode plays, then play it with its seats pinned to them."""
        request = PinRequest(given.run, given.episode, list(given.environment.agents))
        pinned = await workflow.execute_activity(runner_stubs.resolve_pins, request, **QUICK)
        chosen = {p.agent: p.checkpoint for p in pinned}
        agents = [replace(a, checkpoint=chosen.get(a.name, a.checkpoint)) for a in given.environment.agents]
        playing = replace(given, environment=replace(given.environment, agents=agents), pinned=pinned)
        holder = episode_workflow_id(given.run, given.episode)
        holds = [ServingHold(holder, c, PIN_SERVED_WAIT_S) for c in sorted(set(chosen.values()) - {BASE})]
        held: list[ServingHold] = []
        try:
            for hold in holds:
                held.append(hold)
                await workflow.execute_activity(
                    runner_stubs.hold_serving,
                    hold,
                    **heartbeating(
                        timedelta(seconds=PIN_SERVED_WAIT_S + 120),
                        RetryPolicy(maximum_interval=timedelta(seconds=10)),
                    ),
                )
        except ActivityError as error:
            record = episode_record(playing, [], [_failure(error)])
            await workflow.execute_activity(runner_stubs.record_episode, record, **QUICK)
            await self._release(held)
            return record.result
        try:
            return await self._play(playing)
        finally:
            await self._release(held)

    async def _release(self, held: list[ServingHold]) -> None:
        for hold in held:
            await workflow.execute_activity(runner_stubs.release_serving, hold, **QUICK)

    async def _play(self, given: EpisodeInput) -> EpisodeResult:
        need = given.environment.sandbox
        grant: SandboxGrant | None = None
        outcomes: list[AgentResult | BaseException] = []
        inputs = _agent_inputs(given, None)
        if (
            need is None
            and len(inputs) == 1
            and given.environment.replayable
            and not inputs[0].agent.command
            and not given.pinned  # its record names the pinned checkpoint: recorded here
            and workflow.patched(PLAY_AND_RECORD)
        ):
            # One replayable seat and no sandbox: played and recorded in one activity, one workflow task
            # fewer.
            try:
                return await workflow.execute_activity(
                    runner_stubs.play_episode,
                    AgentAttempt(inputs[0], 1, _seat(inputs[0])),
                    start_to_close_timeout=PLAY_TIMEOUT,
                    heartbeat_timeout=PLAY_HEARTBEAT,
                    retry_policy=_play_retry(True),
                )
            except ActivityError as error:
                outcomes = [error]  # recorded below as abandoned, the way a multi-seat episode's is
        elif need is not None:
            try:
                grant = await workflow.execute_activity(
                    runner_stubs.claim_sandbox,
                    ClaimInput(given.run, given.episode, need),
                    **heartbeating(
                        timedelta(seconds=need.wait_s + 120),
                        RetryPolicy(
                            maximum_interval=timedelta(seconds=10),
                            non_retryable_error_types=["NoSandboxFree"],
                        ),
                    ),
                )
            except ActivityError as error:
                outcomes = [error]
        if not outcomes:
            keeper = asyncio.create_task(self._keep_claim(grant, need.ttl_s)) if grant and need else None
            try:
                outcomes = await self._play_agents(given, grant)
            finally:
                if keeper is not None:
                    keeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ActivityError):
                        await keeper
                if grant is not None:
                    await workflow.execute_activity(runner_stubs.release_sandbox, grant, **QUICK)
        record = episode_record(
            given,
            [o for o in outcomes if isinstance(o, AgentResult)],
            [_failure(o) for o in outcomes if isinstance(o, BaseException)],
            sandbox=f"{grant.kind}/{grant.name}@{grant.epoch}" if grant else None,
        )
        await workflow.execute_activity(runner_stubs.record_episode, record, **QUICK)
        return record.result

    async def _play_agents(
        self, given: EpisodeInput, grant: SandboxGrant | None
    ) -> list[AgentResult | BaseException]:
        inputs = _agent_inputs(given, grant)
        if len(inputs) == 1:
            # One seat: play it here. A child workflow would cost a round trip through Temporal per episode
            # (about a third of a one-turn episode's overhead, benchmarks/RESULTS.md) and buy nothing.
            try:
                return [await play_seat(inputs[0])]
            except (ActivityError, ApplicationError) as error:
                return [error]
        plays = [
            workflow.execute_child_workflow(
                AgentWorkflow.run, agent, id=agent_workflow_id(given.run, given.episode, agent.agent.name)
            )
            for agent in inputs
        ]
        return list(await asyncio.gather(*plays, return_exceptions=True))

    async def _keep_claim(self, grant: SandboxGrant, ttl_s: float) -> None:
        # Renew well inside the time to live; a lost claim stops renewal (its agents' actions are refused
        # now).
        while True:
            await workflow.sleep(ttl_s / 3)
            kept = await workflow.execute_activity(runner_stubs.renew_sandbox, args=[grant, ttl_s], **QUICK)
            if not kept:
                workflow.logger.warning("sandbox claim %s/%s lost", grant.kind, grant.name)
                return


@workflow.defn(name="EpisodeSupplyWorkflow")
class EpisodeSupplyWorkflow:
    def __init__(self) -> None:
        self.paused = False
        self.stopping = False
        self.in_flight: set[int] = set()
        self._groups: set[asyncio.Task[None]] = set()
        self.groups_finished = 0
        self.episodes_finished = 0
        self.episodes_failed = 0
        self.groups_failed = 0
        self.allowance: int | None = None
        self.recent_failed: list[bool] = []
        self.given: SupplyInput | None = None
        self.started_at: dict[int, datetime] = {}
        self.group_seconds: list[float] = []
        self.watch_stragglers = False

    @workflow.signal
    def set_paused(self, paused: SupplyPaused) -> None:
        self.paused = paused.paused
        if not paused.paused:
            self.recent_failed = []  # resumed: the environment may be fixed, count afresh

    @workflow.signal
    def stop(self) -> None:
        self.stopping = True

    @workflow.signal
    def set_allowance(self, allowance: SupplyAllowance) -> None:
        self.allowance = allowance.allowance

    @workflow.query
    def counts(self) -> SupplyCounts:
        return SupplyCounts(
            groups_finished=self.groups_finished,
            episodes_finished=self.episodes_finished,
            episodes_failed=self.episodes_failed,
            groups_in_flight=len(self.in_flight),
            groups_failed=self.groups_failed,
            groups_straggling=len(self._straggling()),
        )

    def _straggler_after_s(self) -> float | None:
        """How long a group may play before it is a straggler; None until enough groups finished to say."""
        given = self.given
        if not self.watch_stragglers or given is None or len(self.group_seconds) < given.straggler_after:
            return None
        return max(given.straggler_floor_s, given.straggler_factor * statistics.median(self.group_seconds))

    def _straggling(self) -> set[int]:
        """The groups in flight past the straggler bound, oldest first up to `groups_in_flight`."""
        limit = self._straggler_after_s()
        if limit is None or self.given is None:
            return set()
        now = workflow.now()
        late = sorted(g for g in self.in_flight if (now - self.started_at[g]).total_seconds() > limit)
        return set(late[: self.given.groups_in_flight])

    def _next_straggler_s(self) -> float | None:
        """Seconds until the next group in flight becomes a straggler (the supply's timer), if any will."""
        limit = self._straggler_after_s()
        if limit is None:
            return None
        now = workflow.now()
        ages = [(now - self.started_at[g]).total_seconds() for g in self.in_flight]
        waits = [limit - age for age in ages if age <= limit]  # those not late yet
        return min(waits) + 0.01 if waits else None

    @workflow.run
    async def run(self, given: SupplyInput) -> SupplyCounts:
        self.paused = given.paused
        if given.allowance is not None:  # a signal may have come before the run began: keep the larger
            self.allowance = max(self.allowance or 0, given.allowance)
        self.groups_finished = given.played.groups_finished
        self.episodes_finished = given.played.episodes_finished
        self.episodes_failed = given.played.episodes_failed
        self.groups_failed = given.played.groups_failed
        self.recent_failed = list(given.recent_failed)
        self.given, self.group_seconds = given, list(given.group_seconds)
        self.watch_stragglers = workflow.patched(STRAGGLERS)
        next_group = given.next_group
        started_here = 0

        def exhausted() -> bool:
            return given.max_groups is not None and next_group >= given.max_groups

        def history_full() -> bool:
            return started_here >= GROUPS_PER_HISTORY

        def may_start() -> bool:
            # A group whose every episode failed trains nothing (no step takes it): it does not use up the
            # allowance, or a broken environment would starve training of good groups.
            # Stragglers hold no slot, nor any of the allowance (at most groups_in_flight of them are let off:
            # `_straggling`): two hung groups would otherwise stop the supply until their bound.
            straggling = len(self._straggling())
            allowed = self.allowance is None or next_group < self.allowance + self.groups_failed + straggling
            playing = len(self.in_flight) - straggling
            return (
                not self.paused
                and allowed
                and playing < given.groups_in_flight
                and not exhausted()
                and not history_full()
            )

        finished = self.groups_finished

        def moved() -> bool:
            """A group ended: the straggler bound moved, and with it the next deadline."""
            return self.watch_stragglers and self.groups_finished != finished

        while True:
            finished = self.groups_finished
            try:
                await workflow.wait_condition(
                    lambda: (
                        self.stopping
                        or may_start()
                        or (not self.in_flight and (exhausted() or history_full()))
                        or moved()
                    ),
                    timeout=self._next_straggler_s(),
                )
            except TimeoutError:
                continue  # a group became a straggler: look again
            if self.stopping or (exhausted() and not self.in_flight):
                break
            if history_full() and not self.in_flight:
                workflow.continue_as_new(
                    replace(
                        given,
                        next_group=next_group,
                        paused=self.paused,
                        allowance=self.allowance,
                        played=self.counts(),
                        recent_failed=self.recent_failed,
                        group_seconds=self.group_seconds,
                    )
                )
            if not may_start():
                continue
            self.in_flight.add(next_group)
            self.started_at[next_group] = workflow.now()
            group_task = asyncio.create_task(self._play_group(given, next_group))
            self._groups.add(group_task)
            group_task.add_done_callback(self._groups.discard)
            next_group += 1
            started_here += 1
        await workflow.wait_condition(lambda: not self.in_flight)
        return self.counts()

    async def _play_group(self, given: SupplyInput, group: int) -> None:
        episodes = [
            workflow.execute_child_workflow(
                EpisodeWorkflow.run,
                EpisodeInput(
                    run=given.run,
                    episode=episode_id(group, member),
                    group=group,
                    environment=given.environment,
                ),
                id=episode_workflow_id(given.run, episode_id(group, member)),
            )
            for member in range(given.environment.group_size)
        ]
        results = await asyncio.gather(*episodes)
        for result in results:
            if result.finished:
                self.episodes_finished += 1
            else:
                self.episodes_failed += 1
            await self._count_failure(given, result)
        if not any(result.finished for result in results):
            self.groups_failed += 1
        self.groups_finished += 1
        self.in_flight.discard(group)
        started = self.started_at.pop(group, None)
        if started is not None:
            seconds = (workflow.now() - started).total_seconds()
            self.group_seconds = [*self.group_seconds, seconds][-GROUP_SECONDS_KEPT:]

    async def _count_failure(self, given: SupplyInput, result: EpisodeResult) -> None:
        """Pause (the run, through its workflow, and this supply at once) when more than
        `max_failure_rate` of the last `failure_window` episodes failed."""
        if self.stopping:  # the episodes a stop cut short say nothing of the environment
            return
        window = given.failure_window
        self.recent_failed = [*self.recent_failed, not result.finished][-window:]
        failed = sum(self.recent_failed)
        if self.paused or len(self.recent_failed) < window or failed <= given.max_failure_rate * window:
            return
        self.paused = True
        self.recent_failed = []
        reason = (
            f"{failed} of the last {window} episodes failed (more than run.max_failure_rate="
            f"{given.max_failure_rate:g}); the latest: {result.error}"
        )
        parent = workflow.info().parent
        if parent is not None:
            await workflow.get_external_workflow_handle(parent.workflow_id).signal(
                RunSignals.episodes_failing, PauseAsked(reason)
            )
