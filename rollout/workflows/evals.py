"""`EvalWorkflow` (`eval/{suite}@{version}/{checkpoint}`): one suite version scored on one checkpoint.

Deterministic workflow code only (the rules of rollout.workflows.episodes); activities through their stubs.

Contract:
- It resolves the checkpoint when it runs (so a schedule's `latest:RUN/POLICY` is the newest at each firing);
  one that has no serving target yet (an SFT adapter) is bridged first (`BridgeWorkflow` on `bridge_queue`,
  the trainer's). It asks the engines to serve it unless it is the base model and waits until one does; the
  checkpoint is released however the eval ends.
- Each environment plays under its own eval run (`names.eval_run`): `RunCreated` with the settings `eval`
  (`suite@version`), `checkpoint`, `temperature` (the gateway samples every turn of the run with it) and
  `max_tokens` (the suite's, else the input's `default_max_tokens`); one-episode groups, group `first + i`
  being held-out task `first + i`; every agent seat that is not pinned to a fixed checkpoint already is
  pinned to the checkpoint (a self-play pin, rollout.run.pins, included: an eval run has no lineage). No
  training run reads these episodes: they are never trained.
- One `EvalResult` per (suite@version, checkpoint, environment). An environment already scored is not played
  again; a retried or repeated eval records nothing twice; a runner killed mid-eval costs a replay of its
  episodes (the same seats: the gateway answers from the recorded turns), never a different score.
- At most `episodes_in_flight` of its episodes play at once, across all its environments: environments play
  concurrently in lanes (`eval_lanes`: one per environment up to the bound, the bound split among them), each
  lane taking the next environment once its own is scored. It returns every environment's score in the suite's
  order (`EvalOutcome`).
- With a `gate` (a training run's eval), once the scores are recorded it has the gate decided
  (`decide_eval_gate`, once per suite version and checkpoint) and, when it tripped and this eval recorded the
  decision, acts: `pause` signals the run (`eval_gate_pause`, which pauses it with the reason), `rollback`
  signals the policy's `TrainingWorkflow` (`eval_gate_rollback`: its next step trains from the best earlier
  checkpoint), `warn` only records and logs. A run that has ended is left as it is.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from rollout.environment import AgentSeatSpec
from rollout.run.settings import RunSettings
from rollout.workflows import runner_stubs
from rollout.workflows.bridges import BridgeWorkflow
from rollout.workflows.episode_types import SupplyInput
from rollout.workflows.episodes import EpisodeSupplyWorkflow
from rollout.workflows.eval_types import (
    CheckpointChoice,
    EvalGate,
    EvalInput,
    EvalLookup,
    EvalOutcome,
    EvalRecordInput,
    EvalScore,
    EvalTarget,
    GateInput,
    ServingHold,
)
from rollout.workflows.names import (
    bridge_workflow_id,
    eval_run,
    run_workflow_id,
    supply_workflow_id,
    training_workflow_id,
)
from rollout.workflows.options import QUICK, heartbeating
from rollout.workflows.run_types import GateTripped, RunInput
from rollout.workflows.signals import RunSignals, TrainingSignals
from rollout.workflows.training_types import BridgeInput, RollbackAsked

FOR_GOOD = [
    "UnknownCheckpoint",
    "CheckpointNotServable",
    "NotServed",
    "InvalidMetric",
    "EnvironmentLoadError",
]


FOR_GOOD_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=10), non_retryable_error_types=FOR_GOOD)
# Evals started before their episodes in flight were bounded replay their old commands: every environment at
# once, each with the whole bound.
EVAL_LANES = "eval-lanes"


def eval_lanes(episodes_in_flight: int, environments: int) -> list[int]:
    """How many episodes each lane of an eval keeps in flight: one lane per environment up to the bound, the
    bound split evenly among them (the first lanes take what does not divide); together never more than
    `episodes_in_flight`, unless that is below one (one lane of one)."""
    lanes = max(1, min(episodes_in_flight, environments))
    share, extra = divmod(max(episodes_in_flight, 1), lanes)
    return [share + (1 if lane < extra else 0) for lane in range(lanes)]


def eval_seats(agents: list[AgentSeatSpec], checkpoint: str) -> list[AgentSeatSpec]:
    """The seats an eval plays: every one not pinned to a fixed checkpoint is pinned to `checkpoint`, a
    self-play pin (rollout.run.pins) too, since an eval run has no lineage of its own."""
    return [
        a if a.checkpoint is not None and a.relative_pin is None else replace(a, checkpoint=checkpoint)
        for a in agents
    ]


@workflow.defn(name="EvalWorkflow")
class EvalWorkflow:
    @workflow.run
    async def run(self, given: EvalInput) -> EvalOutcome:
        chosen = await workflow.execute_activity(
            runner_stubs.resolve_checkpoint,
            given.checkpoint,
            **heartbeating(timedelta(minutes=2), FOR_GOOD_RETRY),
        )
        if chosen.policy is not None and not chosen.formats:
            for fmt in given.bridge_formats:  # no engine can load it yet: make it servable first
                await workflow.execute_child_workflow(
                    BridgeWorkflow.run,
                    BridgeInput(chosen.run, chosen.policy, chosen.name, chosen.version, fmt),
                    id=bridge_workflow_id(chosen.policy, chosen.version, fmt),
                    task_queue=given.bridge_queue,
                )
        hold = ServingHold(workflow.info().workflow_id, chosen.name, given.served_wait_s)
        try:
            if chosen.policy is not None:
                await workflow.execute_activity(
                    runner_stubs.hold_serving,
                    hold,
                    **heartbeating(timedelta(seconds=given.served_wait_s + 120), FOR_GOOD_RETRY),
                )
            if workflow.patched(EVAL_LANES):
                scores = await self._score_in_lanes(given, chosen)
            else:
                scores = await asyncio.gather(
                    *(self._score(given, chosen, t, given.episodes_in_flight) for t in given.environments)
                )
        finally:
            if chosen.policy is not None:
                await workflow.execute_activity(runner_stubs.release_serving, hold, **QUICK)
        if given.gate is not None and given.gate.run and chosen.policy is not None:
            await self._gate(given, given.gate, chosen.name, chosen.policy)
        return EvalOutcome(given.suite, given.version, chosen.name, list(scores))

    async def _gate(self, given: EvalInput, gate: EvalGate, checkpoint: str, lineage: str) -> None:
        info = workflow.info()
        decided = await workflow.execute_activity(
            runner_stubs.decide_eval_gate,
            GateInput(
                given.suite, given.version, checkpoint, lineage, gate, f"{info.workflow_id}@{info.run_id}"
            ),
            **QUICK,
        )
        if not decided.act:
            return
        try:
            if gate.action == "pause":
                key = f"{given.suite}@{given.version}/{checkpoint}"
                await workflow.get_external_workflow_handle(run_workflow_id(gate.run)).signal(
                    RunSignals.eval_gate_pause, GateTripped(key, decided.reason)
                )
            elif gate.action == "rollback" and decided.best is not None:
                handle = workflow.get_external_workflow_handle(training_workflow_id(gate.run, gate.policy))
                await handle.signal(
                    TrainingSignals.eval_gate_rollback, RollbackAsked(decided.best, decided.reason)
                )
        except ApplicationError as error:  # the run (or its training) has ended: nothing is left to act on
            workflow.logger.warning("the eval gate could not %s %s: %s", gate.action, gate.run, error)

    async def _score_in_lanes(self, given: EvalInput, chosen: CheckpointChoice) -> list[EvalScore]:
        """Every environment's score, its episodes played in lanes (`eval_lanes`): each lane scores the next
        environment not yet taken, in the suite's order, until none is left."""
        waiting = list(given.environments)
        scores: dict[str, EvalScore] = {}

        async def lane(in_flight: int) -> None:
            while waiting:
                target = waiting.pop(0)
                scores[target.name] = await self._score(given, chosen, target, in_flight)

        await asyncio.gather(*(lane(n) for n in eval_lanes(given.episodes_in_flight, len(waiting))))
        return [scores[target.name] for target in given.environments]

    async def _score(
        self, given: EvalInput, chosen: CheckpointChoice, target: EvalTarget, in_flight: int
    ) -> EvalScore:
        lookup = EvalLookup(given.suite, given.version, chosen.name, target.name)
        found = await workflow.execute_activity(runner_stubs.find_eval_result, lookup, **QUICK)
        if found is not None:
            return found
        run = eval_run(given.suite, given.version, chosen.name, target.name)
        info = await workflow.execute_activity(
            runner_stubs.describe_environment,
            target.reference,
            **heartbeating(timedelta(minutes=2), RetryPolicy(maximum_attempts=3)),
        )
        playing = replace(info, agents=eval_seats(info.agents, chosen.name), group_size=1, tasks=target.tasks)
        settings = RunSettings(
            max_lag=0,
            eval_suite=f"{given.suite}@{given.version}",
            eval_checkpoint=chosen.name,
            temperature=float(target.temperature),
            max_tokens=target.max_tokens or given.default_max_tokens,
            external_models=playing.external_models(),
        )
        await workflow.execute_activity(
            runner_stubs.create_run,
            RunInput(run=run, environment=target.reference, settings=settings),
            **QUICK,
        )
        await workflow.execute_child_workflow(
            EpisodeSupplyWorkflow.run,
            SupplyInput(
                run=run,
                environment=playing,
                groups_in_flight=in_flight,
                max_groups=target.first + target.episodes,
                next_group=target.first,
            ),
            id=supply_workflow_id(run),
        )
        record = EvalRecordInput(given.suite, given.version, given.suite_hash, chosen, target, run)
        return await workflow.execute_activity(
            runner_stubs.record_eval_result, record, **heartbeating(timedelta(minutes=2), FOR_GOOD_RETRY)
        )
