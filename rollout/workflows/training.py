"""The training loop as workflows: assemble a batch, train a step, bridge and serve its checkpoint, again.

Deterministic workflow code only; activities are called through their typed stubs
(rollout.workflows.trainer_stubs) on the trainer queue.

Contract:
- `TrainingWorkflow` (`run/{run}/train/{policy}`) trains the run's lineage of a policy (`{run}/{policy}` in
  the ledger) for steps `next_step..steps`. Each step assembles its batch (`assemble_batch`, idempotent by
  (run, policy, step)); while no whole batch is ready it waits `wait_s` and looks again. With `refill` a tied
  group is replaced by a fresh one (at most `refill_max` per step: rollout.rl.selection), judged by the
  rewards of the agents that train the policy. A batch without a sampled token (every group skipped for
  having no signal: with refill, once a step has replaced `refill_max` and still found only ties) is counted
  and the step number moves on without a checkpoint. Otherwise `train_step` trains from the previous
  checkpoint (`parent`) and publishes exactly one `CheckpointCreated` for the step (fenced by the trainer's
  lease).
- Each checkpoint then goes through one `BridgeWorkflow` per serving format
  (`bridge/{policy}/{version}/{format}`, idempotent): converted for the engines and published as a
  `ServingTarget`. Training does not wait for engines to load it: admission (max_lag) is what holds sampling
  back.
- A step whose loss is not finite publishes nothing: the workflow tells the run (`training_paused` signal with
  the reason, which pauses the run) and waits for `resume_training`; then that batch is skipped and training
  goes on from the same parent.
- The next step always trains from the checkpoint the last one published, so the steps form a chain; a new
  workflow started with an older `parent` branches the tree, and so does an eval gate's rollback
  (`eval_gate_rollback` signal: the next step trains from that checkpoint).
- Each time the step number moves on (a step trained, skipped for no signal, or not published) it tells the
  run (`training_progress` signal with the steps done and the groups refill has replaced), which lets the
  episode supply start more groups; so does a waiting step that has set more tied groups aside, so their
  replacements can start (else refill would wait on a supply held back by max_lag).
- With `evaluation` and `eval_every` N, every checkpoint whose version is a multiple of N, once served as a
  target, is scored by an `EvalWorkflow` child on the run's runner queue
  (`eval/{suite}@{version}/{checkpoint}`), started and not waited for: evals never hold a step back. Their
  failures never fail training.
- After the last step it waits (bounded) until an engine serves the last checkpoint, so a finished run has
  served every checkpoint it made, and for the evals it started in this history. It continues as new every
  `STEPS_PER_HISTORY` steps (evals still playing then are left to finish on their own).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ParentClosePolicy

from rollout.workflows import trainer_stubs
from rollout.workflows.bridges import BridgeWorkflow
from rollout.workflows.eval_types import EvalInput, EvalOutcome
from rollout.workflows.evals import EvalWorkflow
from rollout.workflows.names import (
    EVAL_GATE_ROLLBACK,
    bridge_workflow_id,
    eval_workflow_id,
    run_policy,
)
from rollout.workflows.options import heartbeating
from rollout.workflows.run_types import PauseAsked, TrainingAdvanced
from rollout.workflows.signals import RunSignals
from rollout.workflows.training_types import (
    AssembleInput,
    BridgeInput,
    RollbackAsked,
    ServedWait,
    TrainingInput,
    TrainingPosition,
    TrainingResult,
    TrainStepInput,
)

STEPS_PER_HISTORY = 200
TRAIN_TIMEOUT = timedelta(hours=2)
NOT_RETRYABLE = ["NonFiniteLoss", "EmptyBatch"]


def _non_finite(error: ActivityError) -> str | None:
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.type == "NonFiniteLoss":
        return cause.message
    return None


@workflow.defn(name="TrainingWorkflow")
class TrainingWorkflow:
    def __init__(self) -> None:
        self.resumed = False
        self.rollback_to: str | None = None
        self.step = 0
        self.newest: str | None = None
        self.replaced = 0
        self.evals: list[workflow.ChildWorkflowHandle[EvalWorkflow, EvalOutcome]] = []

    @workflow.signal
    def resume_training(self) -> None:
        self.resumed = True

    @workflow.signal(name=EVAL_GATE_ROLLBACK)
    def eval_gate_rollback(self, asked: RollbackAsked) -> None:
        """An eval's gate tripped with action `rollback`: the next step trains from `checkpoint`."""
        workflow.logger.warning("rolling back to %s: %s", asked.checkpoint, asked.reason)
        self.rollback_to = asked.checkpoint

    @workflow.query
    def progress(self) -> TrainingPosition:
        return TrainingPosition(self.step, self.newest)

    @workflow.run
    async def run(self, given: TrainingInput) -> TrainingResult:
        step, parent, skipped = given.next_step, given.parent, given.skipped_steps
        self.newest = parent
        policy = run_policy(given.run, given.policy)
        own = given.spec.models.get(given.policy)  # its own base model and settings, if it has them
        trained_here = 0
        spec = given.spec
        refill_max = (
            (2 * spec.groups_per_batch if spec.refill_max is None else spec.refill_max)
            if spec.refill
            else None
        )
        self.replaced = 0  # groups refill has replaced (or a waiting step set aside), as last told to the run
        while step <= given.spec.steps:
            self.step = step
            if self.rollback_to is not None:  # a branch: the next checkpoint's parent is the rollback's
                parent, self.rollback_to = self.rollback_to, None
            if trained_here >= STEPS_PER_HISTORY:
                workflow.continue_as_new(replace(given, next_step=step, parent=parent, skipped_steps=skipped))
            lookup = await workflow.execute_activity(
                trainer_stubs.assemble_batch,
                AssembleInput(
                    run=given.run,
                    policy=policy,
                    step=step,
                    group_size=given.group_size,
                    groups_per_batch=given.spec.groups_per_batch,
                    advantage=given.spec.advantage,
                    refill_max=refill_max,
                    agents=given.agents,
                ),
                **heartbeating(timedelta(minutes=5)),
            )
            batch = lookup.batch
            if batch is None:
                if lookup.replaced > self.replaced:  # tied groups set aside: let their replacements start
                    self.replaced = lookup.replaced
                    await self._report(given, step - 1)
                await workflow.sleep(timedelta(seconds=given.spec.wait_s))
                continue
            self.replaced = max(self.replaced, lookup.replaced)
            if batch.sampled_tokens == 0:
                skipped += 1
                step += 1
                await self._report(given, step - 1)
                continue
            try:
                checkpoint = await workflow.execute_activity(
                    trainer_stubs.train_step,
                    TrainStepInput(
                        run=given.run,
                        policy=policy,
                        step=step,
                        batch=batch,
                        parent=parent,
                        advantage=given.spec.advantage,
                        newest=self.newest,
                        model=own,
                    ),
                    start_to_close_timeout=TRAIN_TIMEOUT,
                    heartbeat_timeout=timedelta(seconds=given.spec.heartbeat_s),
                    retry_policy=RetryPolicy(
                        maximum_interval=timedelta(seconds=10),
                        maximum_attempts=10,
                        non_retryable_error_types=NOT_RETRYABLE,
                    ),
                )
            except ActivityError as error:
                reason = _non_finite(error)
                if reason is None:
                    raise
                await self._pause_run(
                    given.run, f"step {step} not published (its loss or gradient is not finite): {reason}"
                )
                skipped += 1
                step += 1
                await self._report(given, step - 1)
                continue
            for fmt in given.spec.serve_formats:
                await workflow.execute_child_workflow(
                    BridgeWorkflow.run,
                    BridgeInput(
                        run=given.run,
                        policy=policy,
                        checkpoint=checkpoint.name,
                        version=checkpoint.version,
                        format=fmt,
                        model=own.model if own else None,
                    ),
                    id=bridge_workflow_id(policy, checkpoint.version, fmt),
                    task_queue=workflow.info().task_queue,
                )
            parent = self.newest = checkpoint.name
            if (
                given.spec.evaluation is not None
                and given.spec.eval_every > 0
                and checkpoint.version % given.spec.eval_every == 0
            ):
                await self._evaluate(given, given.spec.evaluation, checkpoint.name)
            step += 1
            trained_here += 1
            await self._report(given, step - 1)
        if parent is not None and given.spec.served_wait_s > 0:
            await workflow.execute_activity(
                trainer_stubs.wait_served,
                ServedWait(parent, given.spec.served_wait_s),
                **heartbeating(timedelta(seconds=given.spec.served_wait_s + 60)),
            )
        for evaluation in self.evals:
            try:
                await evaluation
            except (ChildWorkflowError, asyncio.CancelledError) as error:
                workflow.logger.warning("an eval of this run failed: %s", error)
        return TrainingResult(
            run=given.run, policy=given.policy, steps=given.spec.steps, newest=parent, skipped_steps=skipped
        )

    async def _evaluate(self, given: TrainingInput, template: EvalInput, checkpoint: str) -> None:
        gate = template.gate and replace(template.gate, run=given.run, policy=given.policy)
        evaluation = replace(template, checkpoint=checkpoint, gate=gate)
        task_queue = given.eval_queue
        try:
            handle = await workflow.start_child_workflow(
                EvalWorkflow.run,
                evaluation,
                id=eval_workflow_id(evaluation.suite, evaluation.version, checkpoint),
                task_queue=task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
            )
        except WorkflowAlreadyStartedError:
            return  # already being scored
        self.evals.append(handle)

    async def _report(self, given: TrainingInput, steps: int) -> None:
        parent = workflow.info().parent
        if parent is not None:
            await workflow.get_external_workflow_handle(parent.workflow_id).signal(
                RunSignals.training_progress, TrainingAdvanced(given.policy, steps, self.replaced)
            )

    async def _pause_run(self, run: str, reason: str) -> None:
        """Pause the run with the reason and wait until it is resumed."""
        self.resumed = False
        parent = workflow.info().parent
        if parent is not None:
            await workflow.get_external_workflow_handle(parent.workflow_id).signal(
                RunSignals.training_paused, PauseAsked(reason)
            )
        await workflow.wait_condition(lambda: self.resumed)
