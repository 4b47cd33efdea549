"""The runner's activities: everything an episode does outside workflow code.

Contract:
- Each activity is idempotent by the business key it is given: seats are opened by seat id (the token is
  derived from it), ledger events are appended under keys built from run, episode, agent and attempt, so a
  retry after a crash writes nothing twice.
- `play_agent` opens the seat, rebuilds the Task from the environment and the group index, and plays it
  through the gateway, heartbeating while it plays. A retried attempt of a replayable environment resumes by
  replay. `play_episode` plays a one-seat episode's seat the same way and records the episode
  (`record_episode`) in the same activity; a retry that finds the episode recorded returns what was recorded
  and plays nothing. An environment whose module file changed since this runner imported it is imported
  again (rollout.activities.reloading: a fixed environment plays on the new code once its run is resumed).
- A seat with an external `command` is played by that command (rollout.activities.external_loop). When the
  play ends, the environment's `trains` (if any) judges each of the seat's conversations; the segments it
  keeps out of training go back with the agent's result and into the episode's record (`untrained`).
- `claim_sandbox` claims a sandbox for an episode (holder `{run}/{episode}`, idempotent by holder) and opens
  it under the claim's epoch, which resets its world; `renew_sandbox` and `release_sandbox` keep and free it.
  The claim's secret (rollout.sandbox.keys) is derived from the sandbox key where it is used (opening, and the
  `SandboxSeat` a Task gets): it never travels through Temporal. The `SandboxGrant` that does is signed with
  that key (`grant_signature`), with the id of the workflow that claimed it. A grant whose signature fails,
  that `play_agent` is given for another episode or from a workflow other than that episode's or its agents',
  or that another workflow asks to renew or release, is refused (`SandboxRefused`) before anything is sent to
  its address.
- Errors a retry cannot fix are non-retryable `ApplicationError`s typed by their `Failure` kind
  (rollout.run.failures: the environment did not load, its code raised or ran past `turn_timeout_s` or
  `episode_timeout_s`, an invalid reward, a request the gateway refused, no sandbox free), with the `Failure`
  record in their details for the episode's record. Anything else propagates, for Temporal to retry.
- Ledger streams: `run/{run}` holds `RunCreated` and `SettingsChanged` (the gateway reads max_lag and pause
  from their projection); `run/{run}/episodes` holds `EpisodeFinished` and `EpisodeAbandoned`.
- Error texts and reasons are recorded scrubbed (rollout.security.redaction): no seat token, key or password
  in clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

import openai
from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollout.activities.agent_loop import (
    EpisodeFault,
    GatewayChat,
    LoopOutcome,
    TaskFailed,
    in_thread,
    play,
    task_call,
)
from rollout.activities.conversations import untrained
from rollout.activities.external_loop import CommandHosts, play_external
from rollout.activities.heartbeat import heartbeating
from rollout.activities.pins import resolve_pins
from rollout.activities.reloading import load_current
from rollout.config import SandboxIsolation
from rollout.environment import Environment, EnvironmentLoadError, SandboxSpec
from rollout.gateway.seats import close_seat, open_seat, seat_token
from rollout.harness import RunContext, SandboxSeat
from rollout.ledger import KeyConflictError, Kind, Lease, Ledger, NewEvent
from rollout.ledger.payloads import AttemptAbandoned, EpisodeEnded, episode_ended_key, turn_recorded
from rollout.ledger.queries import count_events, read_all
from rollout.ledger.streams import run_episodes_stream, run_stream, sandbox_lease, seat_stream
from rollout.records.runs import RunCreated, SettingsChanged
from rollout.run.failures import (
    DETAIL_CHARS,
    ENVIRONMENT_LOAD,
    NO_SANDBOX_FREE,
    SANDBOX_REFUSED,
    TASK_FAILED,
    TASK_TIMED_OUT,
    Failure,
    failure_in,
    one_line,
)
from rollout.run.launches import LAUNCHED
from rollout.sandbox import (
    NoSandboxFree,
    SandboxActionError,
    SandboxClaim,
    SandboxClient,
    SandboxPool,
    SandboxRegistration,
)
from rollout.sandbox.keys import claim_secret, grant_signature, lease_secret, same_secret
from rollout.security.redaction import scrub
from rollout.workflows import runner_stubs
from rollout.workflows.episode_types import (
    AbandonInput,
    AgentAttempt,
    AgentResult,
    ClaimInput,
    EnvironmentInfo,
    EpisodeInput,
    EpisodeRecord,
    EpisodeResult,
    PinnedSeat,
    PinRequest,
    SandboxGrant,
    episode_record,
)
from rollout.workflows.names import agent_workflow_id, run_policy
from rollout.workflows.run_types import RunInput, SettingsChange

log = logging.getLogger(__name__)


class RunnerActivities:
    def __init__(
        self,
        ledger: Ledger,
        *,
        gateway_url: str,
        seat_secret: bytes,
        sandbox_key: bytes,
        outage_window_s: float = 600.0,
        isolation: SandboxIsolation = SandboxIsolation.bwrap,
        command_pool: str = "",
    ) -> None:
        self.ledger = ledger
        self.isolation = isolation
        self.command_pool = command_pool  # command seats run on hosts of this pool ("": in this jail)
        self.sandbox_key = sandbox_key
        self.outage_window_s = outage_window_s
        self.gateway_url = gateway_url.rstrip("/")
        self.seat_secret = seat_secret
        self._http: openai.DefaultAsyncHttpxClient | None = None

    def http(self) -> openai.DefaultAsyncHttpxClient:
        """The HTTP client every agent of this runner reaches the gateway with (made on the worker's loop)."""
        if self._http is None:
            self._http = openai.DefaultAsyncHttpxClient()
        return self._http

    @activity.defn(name=runner_stubs.describe_environment.__name__)
    async def describe_environment(self, reference: str) -> EnvironmentInfo:
        async with heartbeating():
            environment = await asyncio.to_thread(_load, reference)
        return EnvironmentInfo(
            reference=reference,
            name=environment.name,
            agents=list(environment.agents),
            group_size=environment.group_size,
            max_turns=environment.max_turns,
            replayable=environment.replayable,
            sandbox=environment.sandbox,
        )

    @activity.defn(name=runner_stubs.create_run.__name__)
    async def create_run(self, run: RunInput) -> None:
        # This runner's isolation is the run's record of how its agents' commands were confined.
        settings = replace(
            run.settings,
            paused=False,
            sandbox_isolation=self.isolation.value,
            command_pool=self.command_pool or None,
        )
        created = RunCreated(run.run, run.environment, settings.recorded())
        events = [NewEvent("created", Kind.RUN_CREATED, created.to_payload())]
        if run.launch is not None:
            events.append(NewEvent(LAUNCHED, Kind.RUN_LAUNCHED, run.launch.to_payload()))
        await self.ledger.append(run_stream(run.run), events)

    @activity.defn(name=runner_stubs.change_settings.__name__)
    async def change_settings(self, change: SettingsChange) -> None:
        recorded = change.changes.recorded()
        changes = {name: scrub(v) if isinstance(v, str) else v for name, v in recorded.items()}
        changed = SettingsChanged(change.run, changes)
        await self.ledger.append_one(
            run_stream(change.run),
            NewEvent(f"settings/{change.key}", Kind.SETTINGS_CHANGED, changed.to_payload()),
        )

    @activity.defn(name=runner_stubs.resolve_pins.__name__)
    async def resolve_pins(self, request: PinRequest) -> list[PinnedSeat]:
        return await resolve_pins(self.ledger, request)

    @activity.defn(name=runner_stubs.play_agent.__name__)
    async def play_agent(self, attempt: AgentAttempt) -> AgentResult:
        given = attempt.input
        environment = _load(given.environment.reference)
        package = given.environment.reference.partition(":")[0]
        try:
            source = environment.task_source(given.environment.tasks)
        except ValueError as error:  # an eval's task selection the environment cannot give
            raise _failed(Failure(TASK_FAILED, one_line(str(error)))) from error
        draw = type(source).parameters
        try:
            parameters = await task_call(
                in_thread(lambda: source.parameters(given.group)),
                f"the task source's draw {given.group}",
                package,
                environment.turn_timeout_s,
                draw,
            )
        except EpisodeFault as error:
            raise _failed(error.failure) from error
        agent = given.agent
        await open_seat(
            self.ledger,
            self.seat_secret,
            seat_id=attempt.seat,
            agent=agent.name,
            policy=run_policy(given.run, agent.policy),
            run=given.run,
            episode=given.episode,
            checkpoint=agent.checkpoint,
        )
        token = seat_token(self.seat_secret, attempt.seat)
        box = given.sandbox
        if box is not None:
            _check_grant(
                self.sandbox_key,
                box,
                holder=f"{given.run}/{given.episode}",
                workflows=(box.workflow_id, agent_workflow_id(given.run, given.episode, agent.name)),
                workflow_id=activity.info().workflow_id or "",
            )
        sandbox = (
            SandboxSeat(
                address=box.address,
                kind=box.kind,
                name=box.name,
                epoch=box.epoch,
                seat=given.sandbox_seat,
                holder=box.holder,
                secret=claim_secret(self.sandbox_key, box.kind, box.name, box.epoch, box.holder),
                gateway_url=f"{self.gateway_url}/s/{token}"
                if environment.sandbox is not None and environment.sandbox.access.gateway
                else "",
            )
            if box
            else None
        )
        context = RunContext(
            run=given.run,
            episode=given.episode,
            seat=attempt.seat,
            attempt=attempt.attempt,
            parameters=parameters,
            sandbox=sandbox,
            isolation=self.isolation,
        )
        limit_s = environment.episode_timeout_s
        try:
            # Model calls can be long: heartbeat between turns too, so only a dead worker times out.
            async with heartbeating():
                bound = asyncio.timeout(limit_s)
                try:
                    async with bound:
                        outcome = await self._play(
                            environment, context, token, given.environment.max_turns, agent.name
                        )
                except TimeoutError:
                    if not bound.expired():
                        raise
                    reason = f"the episode did not end within {limit_s:g} s (Environment.episode_timeout_s)"
                    raise TaskFailed(Failure(TASK_TIMED_OUT, reason)) from None
                kept_out = await self._untrained(environment, attempt.seat)
        except EpisodeFault as error:
            raise _failed(replace(error.failure, seat=attempt.seat)) from error
        return AgentResult(
            agent=agent.name,
            seat=attempt.seat,
            reward=outcome.reward,
            turns=outcome.turns,
            attempts=attempt.attempt,
            truncated=outcome.truncated,
            metrics=outcome.metrics,
            untrained=kept_out,
        )

    async def _play(
        self, environment: Environment, context: RunContext, token: str, max_turns: int, agent: str
    ) -> LoopOutcome:
        try:
            task = environment.make_task(context.parameters, agent)
        except Exception as error:
            package = getattr(environment.make_task, "__module__", None) or ""
            raise TaskFailed(failure_in(error, TASK_FAILED, "make_task", package)) from error
        spec = environment.agent(agent)
        if spec.command:
            return await play_external(
                task,
                context,
                spec.command,
                base_url=self.gateway_url,
                token=token,
                timeout_s=spec.timeout_s,
                turn_timeout_s=environment.turn_timeout_s,
                count_turns=lambda: self._turns(context.seat),
                isolation=self.isolation,
                readable=spec.readable,
                packages=spec.packages,
                hosts=CommandHosts(SandboxPool(self.ledger, self.sandbox_key), self.command_pool)
                if self.command_pool
                else None,
            )
        model = GatewayChat(
            f"{self.gateway_url}/s/{token}/v1",
            token,
            http_client=self.http(),
            outage_window_s=self.outage_window_s,
            on_wait=lambda why: log.info(
                "seat %s: the gateway is unreachable (%s); retrying", context.seat, why
            ),
        )
        try:
            return await play(
                task,
                context,
                model,
                max_turns=max_turns,
                turn_timeout_s=environment.turn_timeout_s,
                on_turn=activity.heartbeat,
            )
        finally:
            await model.close()

    async def _untrained(self, environment: Environment, seat: str) -> list[str]:
        """The seat's conversations its environment keeps out of training (none unless it has `trains`)."""
        if environment.trains is None:
            return []
        events = await read_all(self.ledger, seat_stream(seat))
        turns = [turn_recorded(e.payload) for e in events if e.kind == Kind.TURN_RECORDED]
        package = getattr(environment.trains, "__module__", None) or ""
        return await task_call(
            in_thread(lambda: untrained(environment, turns)),
            "trains",
            package,
            environment.turn_timeout_s,
            environment.trains,
        )

    async def _turns(self, seat: str) -> int:
        return await count_events(self.ledger, seat_stream(seat), Kind.TURN_RECORDED)

    @activity.defn(name=runner_stubs.claim_sandbox.__name__)
    async def claim_sandbox(self, given: ClaimInput) -> SandboxGrant:
        need = given.need
        holder = f"{given.run}/{given.episode}"
        try:
            async with heartbeating():
                claim = await SandboxPool(self.ledger, self.sandbox_key).claim(
                    need.kind,
                    need.seats,
                    holder,
                    ttl_s=need.ttl_s,
                    wait_s=need.wait_s,
                    open=functools.partial(_open, self.sandbox_key, need),
                )
        except NoSandboxFree as error:
            raise _failed(Failure(NO_SANDBOX_FREE, one_line(str(error)))) from error
        except SandboxActionError as error:  # the server refused the environment's limits or network
            raise _failed(Failure(SANDBOX_REFUSED, one_line(str(error)))) from error
        box = claim.sandbox
        grant = SandboxGrant(
            kind=box.kind,
            name=box.name,
            address=box.address,
            epoch=claim.epoch,
            holder=holder,
            workflow_id=activity.info().workflow_id or "",
        )
        return _signed(self.sandbox_key, grant)

    @activity.defn(name=runner_stubs.renew_sandbox.__name__)
    async def renew_sandbox(self, grant: SandboxGrant, ttl_s: float) -> bool:
        """Extend the claim; False when it was lost (it expired and another episode claimed the sandbox)."""
        claim = _claim_of(self.sandbox_key, grant, workflow_id=activity.info().workflow_id or "")
        return await SandboxPool(self.ledger).renew(claim, ttl_s) is not None

    @activity.defn(name=runner_stubs.release_sandbox.__name__)
    async def release_sandbox(self, grant: SandboxGrant) -> None:
        claim = _claim_of(self.sandbox_key, grant, workflow_id=activity.info().workflow_id or "")
        await SandboxPool(self.ledger).release(claim)

    @activity.defn(name=runner_stubs.play_episode.__name__)
    async def play_episode(self, attempt: AgentAttempt) -> EpisodeResult:
        given = attempt.input
        # A retry after the episode was recorded (its runner died before reporting) plays nothing: the seat is
        # closed by then, so a replay would fail and record the episode a second time, as failed.
        recorded = await self.ledger.find(
            run_episodes_stream(given.run), episode_ended_key(given.episode, finished=True)
        )
        if recorded is not None:
            ended = EpisodeEnded.from_payload(recorded.payload)
            for seat in ended.seats.values():
                await self._close(seat, "finished")
            return EpisodeResult(ended.run, ended.episode, ended.group, finished=True, rewards=ended.rewards)
        played = await self.play_agent(attempt)
        episode = EpisodeInput(given.run, given.episode, given.group, given.environment)
        record = episode_record(episode, [played], [])
        await self.record_episode(record)
        return record.result

    @activity.defn(name=runner_stubs.abandon_attempt.__name__)
    async def abandon_attempt(self, abandon: AbandonInput) -> None:
        attempt = abandon.attempt
        given = attempt.input
        abandoned = AttemptAbandoned(
            run=given.run,
            episode=given.episode,
            agent=given.agent.name,
            seat=attempt.seat,
            attempt=attempt.attempt,
            reason=scrub(abandon.reason),  # an error's text: it may quote a seat's URL or a key
        )
        await self.ledger.append_one(
            run_episodes_stream(given.run),
            NewEvent(abandoned.key, Kind.EPISODE_ABANDONED, abandoned.to_payload()),
        )
        await self._close(attempt.seat, "abandoned")

    @activity.defn(name=runner_stubs.record_episode.__name__)
    async def record_episode(self, record: EpisodeRecord) -> None:
        result = record.result
        ended = EpisodeEnded(
            run=result.run,
            episode=result.episode,
            group=result.group,
            finished=result.finished,
            environment=record.environment,
            rewards=result.rewards,
            error=None if result.error is None else scrub(result.error),
            seats=record.seats,
            turns=record.turns,
            metrics=record.metrics,
            sandbox=record.sandbox,
            untrained={agent: ids for agent, ids in record.untrained.items() if ids},
            pinned=record.pinned,
            failure=None
            if record.failure is None
            else replace(
                record.failure, reason=scrub(record.failure.reason), detail=scrub(record.failure.detail)
            ),
        )
        await self.ledger.append_one(
            run_episodes_stream(result.run), NewEvent(ended.key, ended.kind, ended.to_payload())
        )
        for seat in record.seats.values():
            await self._close(seat, "finished" if result.finished else "failed")

    async def _close(self, seat: str, reason: str) -> None:
        # A seat closes once; a later close (a retry that found it closed for another reason) changes nothing.
        with contextlib.suppress(KeyConflictError):
            await close_seat(self.ledger, seat, reason)

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [
            self.describe_environment,
            self.create_run,
            self.change_settings,
            self.resolve_pins,
            self.play_agent,
            self.play_episode,
            self.abandon_attempt,
            self.record_episode,
            self.claim_sandbox,
            self.renew_sandbox,
            self.release_sandbox,
        ]


def _load(reference: str) -> Environment:
    try:
        return load_current(reference)
    except EnvironmentLoadError as error:
        raise _failed(
            Failure(ENVIRONMENT_LOAD, one_line(str(error)), detail=str(error)[-DETAIL_CHARS:])
        ) from error


async def _open(key: bytes, need: SandboxSpec, claim: SandboxClaim) -> None:
    # Opening under the new epoch resets the world, and fences off whoever held the sandbox before.
    box = claim.sandbox
    async with SandboxClient(
        SandboxSeat(
            address=box.address,
            kind=box.kind,
            name=box.name,
            epoch=claim.epoch,
            seat=0,
            holder=claim.lease.holder,
            secret=claim_secret(key, box.kind, box.name, claim.epoch, claim.lease.holder),
        ),
        timeout_s=60,
    ) as client:
        # The claim's `/open` takes the spec as JSON.
        await client.open(
            limits=need.limits.as_json() if need.limits else None, network=need.access.entries()
        )


def _failed(failure: Failure) -> ApplicationError:
    """The episode's failure as Temporal carries it: typed by its kind, never retried, the record in its
    details (the workflow records it with the episode)."""
    return ApplicationError(failure.summary, failure.to_payload(), type=failure.kind, non_retryable=True)


def _signed(key: bytes, grant: SandboxGrant) -> SandboxGrant:
    signature = grant_signature(
        key, grant.kind, grant.name, grant.address, grant.epoch, grant.holder, grant.workflow_id
    )
    return replace(grant, signature=signature)


def _check_grant(
    key: bytes,
    grant: SandboxGrant,
    *,
    holder: str | None = None,
    workflows: Sequence[str] = (),
    workflow_id: str = "",
) -> None:
    """A grant crossed Temporal, which anyone who reaches it can write to: act on it only when a runner of
    this key signed it, (playing) only for the episode it was claimed for, and only from one of `workflows`
    (the claiming episode's, and for playing its agents'), when given."""
    if not same_secret(grant.signature, _signed(key, grant).signature) or holder not in (None, grant.holder):
        raise _failed(
            Failure(
                SANDBOX_REFUSED,
                f"the sandbox grant for {grant.kind}/{grant.name} was not made by a runner of this stack for "
                f"this episode: nothing is sent to {grant.address}",
            )
        )
    if workflows and (not workflow_id or workflow_id not in workflows):
        raise _failed(
            Failure(
                SANDBOX_REFUSED,
                f"the sandbox grant for {grant.kind}/{grant.name} was claimed by another workflow: only the "
                "episode that claimed it, and its agents, act on it",
            )
        )


def _claim_of(key: bytes, grant: SandboxGrant, *, workflow_id: str) -> SandboxClaim:
    """The claim a grant renews or releases: only from the workflow that claimed it (a grant copied out of
    Temporal's history into a workflow of one's own would otherwise end another episode's claim)."""
    _check_grant(key, grant, workflows=(grant.workflow_id,), workflow_id=workflow_id)
    # Renewing and releasing match on (resource, holder, epoch, secret); the seats and expiry play no part.
    resource = sandbox_lease(grant.kind, grant.name)
    secret = lease_secret(key, resource, grant.holder)
    lease = Lease(resource, grant.holder, grant.epoch, expires_at=datetime.now(UTC), secret=secret)
    return SandboxClaim(
        SandboxRegistration(kind=grant.kind, name=grant.name, address=grant.address, seats=0), lease
    )
