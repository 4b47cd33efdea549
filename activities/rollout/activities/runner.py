"""The runner's activities: everything an episode does outside workflow code.

Contract:
- Each activity is idempotent by the business key it is given: seats are opened by seat id (the token is
  derived from it), ledger events are appended under keys built from run, episode, agent and attempt, so a retry
  after a crash writes nothing twice.
- `play_agent` opens the seat, rebuilds the Task from the environment and the group index, and plays it through
  the gateway, heartbeating while it plays. A retried attempt of a replayable environment resumes by replay.
- Errors a retry cannot fix are non-retryable `ApplicationError`s, typed: `EnvironmentLoadError`, `TaskFailed`
  (the Task raised; the traceback is in the message), `InvalidReward`.
- Ledger streams: `run/{run}` holds `RunCreated` and `SettingsChanged` (the gateway reads max_lag and pause from
  their projection); `run/{run}/episodes` holds `EpisodeFinished` and `EpisodeAbandoned`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollout.activities.agent_loop import GatewayChat, InvalidReward, TaskFailed, play
from rollout.environment import EnvironmentLoadError, load_environment
from rollout.gateway.seats import close_seat, open_seat, seat_token
from rollout.harness import RunContext
from rollout.ledger import KeyConflictError, Kind, Ledger, NewEvent
from rollout.workflows.types import (
    AbandonInput,
    AgentAttempt,
    AgentInfo,
    AgentResult,
    EnvironmentInfo,
    EpisodeRecord,
    RunInput,
    SettingsChange,
)

HEARTBEAT_EVERY_S = 2.0


def run_stream(run: str) -> str:
    return f"run/{run}"


def episodes_stream(run: str) -> str:
    return f"run/{run}/episodes"


class RunnerActivities:
    def __init__(self, ledger: Ledger, *, gateway_url: str, seat_secret: bytes) -> None:
        self.ledger = ledger
        self.gateway_url = gateway_url.rstrip("/")
        self.seat_secret = seat_secret

    @activity.defn(name="describe_environment")
    async def describe_environment(self, reference: str) -> EnvironmentInfo:
        try:
            environment = load_environment(reference)
        except EnvironmentLoadError as error:
            raise ApplicationError(str(error), type="EnvironmentLoadError", non_retryable=True) from error
        agents = [AgentInfo(a.name, a.policy, a.checkpoint, bool(a.command)) for a in environment.agents]
        return EnvironmentInfo(reference, environment.name, agents, environment.group_size, environment.max_turns,
                               environment.replayable)  # fmt: skip

    @activity.defn(name="create_run")
    async def create_run(self, run: RunInput) -> None:
        settings = {"max_lag": run.max_lag, "paused": False, **run.settings}
        payload = {"run": run.run, "environment": run.environment, "settings": settings}
        await self.ledger.append_one(run_stream(run.run), NewEvent("created", Kind.RUN_CREATED, payload))

    @activity.defn(name="change_settings")
    async def change_settings(self, change: SettingsChange) -> None:
        payload = {"run": change.run, "changes": change.changes}
        await self.ledger.append_one(
            run_stream(change.run), NewEvent(f"settings/{change.key}", Kind.SETTINGS_CHANGED, payload)
        )

    @activity.defn(name="play_agent")
    async def play_agent(self, attempt: AgentAttempt) -> AgentResult:
        given = attempt.input
        try:
            environment = load_environment(given.environment.reference)
        except EnvironmentLoadError as error:
            raise ApplicationError(str(error), type="EnvironmentLoadError", non_retryable=True) from error
        parameters = environment.source.parameters(given.group)
        agent = given.agent
        await open_seat(self.ledger, self.seat_secret, seat_id=attempt.seat, agent=agent.name, policy=agent.policy,
                        run=given.run, episode=given.episode, checkpoint=agent.checkpoint)  # fmt: skip
        token = seat_token(self.seat_secret, attempt.seat)
        context = RunContext(given.run, given.episode, attempt.seat, attempt.attempt, parameters)
        model = GatewayChat(f"{self.gateway_url}/s/{token}/v1", token)
        beating = asyncio.create_task(_heartbeat_until_cancelled())
        try:
            task = environment.make_task(parameters, agent.name)
            outcome = await play(task, context, model, max_turns=given.environment.max_turns,
                                 on_turn=activity.heartbeat)  # fmt: skip
        except TaskFailed as error:
            raise ApplicationError(str(error), type="TaskFailed", non_retryable=True) from error
        except InvalidReward as error:
            raise ApplicationError(str(error), type="InvalidReward", non_retryable=True) from error
        finally:
            beating.cancel()
            await model.close()
        return AgentResult(agent.name, attempt.seat, outcome.reward, outcome.turns, attempt.attempt,
                           outcome.truncated, outcome.metrics)  # fmt: skip

    @activity.defn(name="abandon_attempt")
    async def abandon_attempt(self, abandon: AbandonInput) -> None:
        attempt = abandon.attempt
        given = attempt.input
        payload = {"run": given.run, "episode": given.episode, "agent": given.agent.name, "seat": attempt.seat,
                   "attempt": attempt.attempt, "reason": abandon.reason, "trainable": False}  # fmt: skip
        key = f"{given.episode}/{given.agent.name}/attempt/{attempt.attempt}/abandoned"
        await self.ledger.append_one(
            episodes_stream(given.run), NewEvent(key, Kind.EPISODE_ABANDONED, payload)
        )
        await self._close(attempt.seat, "abandoned")

    @activity.defn(name="record_episode")
    async def record_episode(self, record: EpisodeRecord) -> None:
        result = record.result
        payload = {
            **asdict(result),
            "environment": record.environment,
            "seats": record.seats,
            "turns": record.turns,
        }
        if result.finished:
            event = NewEvent(f"{result.episode}/finished", Kind.EPISODE_FINISHED, payload)
        else:
            event = NewEvent(
                f"{result.episode}/failed", Kind.EPISODE_ABANDONED, {**payload, "trainable": False}
            )
        await self.ledger.append_one(episodes_stream(result.run), event)
        for seat in record.seats.values():
            await self._close(seat, "finished" if result.finished else "failed")

    async def _close(self, seat: str, reason: str) -> None:
        # A seat closes once; a later close (a retry that found it closed for another reason) changes nothing.
        with contextlib.suppress(KeyConflictError):
            await close_seat(self.ledger, seat, reason)

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.describe_environment, self.create_run, self.change_settings, self.play_agent,
                self.abandon_attempt, self.record_episode]  # fmt: skip


async def _heartbeat_until_cancelled() -> None:
    # Model calls can be long: keep the heartbeat going between turns too, so only a dead worker times out.
    while True:
        await asyncio.sleep(HEARTBEAT_EVERY_S)
        activity.heartbeat()
