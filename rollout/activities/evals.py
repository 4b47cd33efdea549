"""The runner's eval activities: which checkpoint, keeping it served, and the scores.

Contract (each stub's docstring in rollout.workflows.runner_stubs is its activity's contract):
- Every write is idempotent by its ledger key: a serving request or release by `{holder}/{checkpoint}`, a
  result by `{version}/{checkpoint}/{environment}` (rollout.evals.records), so a retried activity writes
  nothing twice.
- A score is computed from the finished episodes recorded on the eval run's `run/{run}/episodes` (one per
  episode, whatever attempts it took); a multi-agent episode counts as the mean of its agents' rewards.
- A training run's eval decides its gate once (rollout.evals.gates), keyed by suite version and checkpoint.
- Errors a retry cannot fix are non-retryable `ApplicationError`s, typed: `UnknownCheckpoint`,
  `CheckpointNotServable`, `NotServed`, `InvalidMetric`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollout.activities.heartbeat import heartbeating
from rollout.evals.checkpoints import UnknownCheckpoint, resolve
from rollout.evals.gates import decide
from rollout.evals.records import find_result, record_result
from rollout.evals.scoring import MetricError, score
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.payloads import episode_ended
from rollout.ledger.queries import read_all
from rollout.ledger.streams import SERVING_REQUESTS, run_episodes_stream
from rollout.records.evals import EvalResult
from rollout.records.serving import ServingRequest
from rollout.serving.states import EngineStates
from rollout.workflows import runner_stubs
from rollout.workflows.eval_types import (
    CheckpointChoice,
    EvalLookup,
    EvalRecordInput,
    EvalScore,
    GateInput,
    GateOutcome,
    ServingHold,
)


class EvalActivities:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @activity.defn(name=runner_stubs.resolve_checkpoint.__name__)
    async def resolve_checkpoint(self, reference: str) -> CheckpointChoice:
        try:
            chosen = await resolve(self.ledger, reference)
        except UnknownCheckpoint as error:
            raise ApplicationError(str(error), type="UnknownCheckpoint", non_retryable=True) from error
        return CheckpointChoice(chosen.name, chosen.policy, chosen.version, list(chosen.formats), chosen.run)

    @activity.defn(name=runner_stubs.hold_serving.__name__)
    async def hold_serving(self, hold: ServingHold) -> None:
        chosen = await resolve(self.ledger, hold.checkpoint)
        if not chosen.formats:
            raise ApplicationError(
                f"checkpoint {hold.checkpoint} has no serving target: no engine can load it (a training run "
                "publishes one for each of its checkpoints)",
                type="CheckpointNotServable",
                non_retryable=True,
            )
        request = ServingRequest(hold.holder, hold.checkpoint)
        await self.ledger.append_one(
            SERVING_REQUESTS, NewEvent(request.requested_key, Kind.SERVING_REQUESTED, request.to_payload())
        )
        deadline = time.monotonic() + hold.wait_s
        states = EngineStates()
        async with heartbeating():
            while True:
                await states.refresh(self.ledger)
                if any(ack.serves(hold.checkpoint) and not ack.sleeping for ack in states.values()):
                    return
                if time.monotonic() >= deadline:
                    raise ApplicationError(
                        f"no engine served {hold.checkpoint} within {hold.wait_s:.0f} s (formats: "
                        f"{', '.join(chosen.formats)}); `rollout status` shows the engines and what they serve",
                        type="NotServed",
                        non_retryable=True,
                    )
                await asyncio.sleep(0.5)

    @activity.defn(name=runner_stubs.release_serving.__name__)
    async def release_serving(self, hold: ServingHold) -> None:
        request = ServingRequest(hold.holder, hold.checkpoint)
        await self.ledger.append_one(
            SERVING_REQUESTS, NewEvent(request.released_key, Kind.SERVING_RELEASED, request.to_payload())
        )

    @activity.defn(name=runner_stubs.find_eval_result.__name__)
    async def find_eval_result(self, lookup: EvalLookup) -> EvalScore | None:
        found = await find_result(
            self.ledger, lookup.suite, lookup.version, lookup.checkpoint, lookup.environment
        )
        return None if found is None else _score_of(found)

    @activity.defn(name=runner_stubs.record_eval_result.__name__)
    async def record_eval_result(self, given: EvalRecordInput) -> EvalScore:
        target = given.target
        ended = [
            e
            for event in await read_all(self.ledger, run_episodes_stream(given.run))
            if (e := episode_ended(event))
        ]
        by_episode = {e.episode: e for e in ended if not e.finished} | {
            e.episode: e for e in ended if e.finished
        }
        finished = sorted((e for e in by_episode.values() if e.finished), key=lambda e: e.episode)
        rewards = [statistics.fmean(e.rewards.values()) for e in finished if e.rewards]
        try:
            scored = await asyncio.to_thread(score, target.metric, rewards, threshold=target.threshold)
        except MetricError as error:
            raise ApplicationError(str(error), type="InvalidMetric", non_retryable=True) from error
        result = EvalResult(
            suite=given.suite,
            version=given.version,
            suite_hash=given.suite_hash,
            checkpoint=given.checkpoint.name,
            checkpoint_version=given.checkpoint.version,
            policy=given.checkpoint.policy,
            environment=target.name,
            reference=target.reference,
            metric=target.metric,
            score=scored.value,
            low=scored.low,
            high=scored.high,
            episodes=scored.episodes,
            failed=len(by_episode) - len(finished),
            run=given.run,
            seats=[seat for e in finished for seat in e.seats.values()],
        )
        return _score_of(await record_result(self.ledger, result))

    @activity.defn(name=runner_stubs.decide_eval_gate.__name__)
    async def decide_eval_gate(self, given: GateInput) -> GateOutcome:
        decision, recorded_here = await decide(
            self.ledger,
            suite=given.suite,
            version=given.version,
            checkpoint=given.checkpoint,
            lineage=given.lineage,
            max_drop=given.gate.max_drop,
            action=given.gate.action,
            decided_by=given.decided_by,
        )
        if decision.tripped:
            activity.logger.warning("eval gate (%s): %s", decision.action, decision.reason)
        return GateOutcome(
            decision.tripped, decision.reason, decision.best, act=recorded_here and decision.tripped
        )

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [
            self.resolve_checkpoint,
            self.hold_serving,
            self.release_serving,
            self.find_eval_result,
            self.record_eval_result,
            self.decide_eval_gate,
        ]


def _score_of(result: EvalResult) -> EvalScore:
    return EvalScore(
        environment=result.environment,
        score=result.score,
        low=result.low,
        high=result.high,
        episodes=result.episodes,
        failed=result.failed,
        run=result.run,
    )
