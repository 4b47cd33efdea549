"""`RunWorkflow` (`run/{run}`): owns a run. It checks the environment, records the run, starts the episode
supply, and takes the run's updates.

Contract:
- Updates `pause`, `resume`, `set_max_lag(n)` and `stop` are validated, recorded in the ledger first
  (`SettingsChanged` on `run/{run}`, keyed by the update's id, so a retried update records once), then
  applied: the gateway reads max_lag and pause from the ledger on the next turn, and the supply starts no new
  group while paused. Updates are serialised by a lock; queries (`status`) keep working while paused.
- An update that arrives before the run is recorded waits for it, so `SettingsChanged` always follows
  `RunCreated` in the ledger.
- The run records, with its settings, which policies an external model answers
  (`RunSettings.external_models`), so the gateway answers their seats with that model.
- With `training`, it starts one `TrainingWorkflow` per trained policy of the environment (agents that are
  neither pinned to a checkpoint nor answered by an external model; command agents train), on the trainer
  queue (a policy's own, `PolicyModel.task_queue`, where it names one). When every one has trained its steps
  the supply stops and the run ends once the groups in flight finish. max_lag bounds the supply too: it may
  have started `(steps trained + max_lag + 1) × groups_per_batch` groups (the fewest steps of any trained
  policy), so no episode starts that would be trained on by a policy more than max_lag checkpoints newer;
  max_lag 0 is a synchronous loop. Refill raises that bound by the groups it replaced (the most any trained
  policy has, a waiting step's set-aside ones included), so a tied group's replacement can start. Each
  training workflow reports its steps and groups replaced (`training_progress`). A training
  step that cannot be published (a non-finite loss) pauses the run with the reason (`training_paused`);
  `resume` lets training go on. So does a supply whose recent episodes fail more than `max_failure_rate` of
  the time (`episodes_failing`): the run pauses with the count and the latest failure, and `resume` (once the
  environment is fixed: restarted runners load the new code) plays on. So does an eval gate that tripped with
  action `pause` (`eval_gate_pause`, once per gate: suite version and checkpoint).
- With `training` and `tracking`, it starts the run's `TrackingWorkflow` (its trained policies filled in)
  before training, abandoned when the run closes: the feed logs what the run's end recorded, then ends.
- The run ends when the supply has played `max_groups` groups, or after `stop` once the groups in flight
  finish, or when training is done. It returns its final status. The status counts the supply's groups and
  episodes (`SupplyCounts`) once the supply has ended: 0 until then.
- Clients start and find it through rollout.workflows.client (`start_run`, `run_handle`) and call its updates
  and query by reference (`handle.execute_update(RunWorkflow.pause)`); `TrainingWorkflow` signals it by the
  names in rollout.workflows.names, since it cannot import this module.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.workflow import ParentClosePolicy

from rollout.rl.selection import supply_allowance
from rollout.run.settings import BadRunSetting, MaxLagChange, RunSettingsChange, RunStatus, max_lag_of
from rollout.workflows import runner_stubs
from rollout.workflows.episode_types import (
    EnvironmentInfo,
    SupplyAllowance,
    SupplyCounts,
    SupplyInput,
    SupplyPaused,
)
from rollout.workflows.episodes import EpisodeSupplyWorkflow
from rollout.workflows.names import (
    EPISODES_FAILING,
    EVAL_GATE_PAUSE,
    TRAINING_PAUSED,
    TRAINING_PROGRESS,
    supply_workflow_id,
    tracking_workflow_id,
    training_workflow_id,
)
from rollout.workflows.options import QUICK, heartbeating
from rollout.workflows.run_types import GateTripped, PauseAsked, RunInput, SettingsChange, TrainingAdvanced
from rollout.workflows.tracking import TrackingWorkflow
from rollout.workflows.training import TrainingWorkflow
from rollout.workflows.training_types import TrainingInput, TrainingSpec


@dataclass
class _RunState:
    run: str = ""
    paused: bool = False
    stopped: bool = False
    max_lag: int = 0
    supply_done: bool = False
    counts: SupplyCounts = field(default_factory=SupplyCounts)  # the supply's, once it has ended
    pause_reason: str | None = None
    training_paused: bool = False
    trained: dict[str, str | None] | None = None
    training_policies: list[str] | None = None
    groups_per_batch: int = 0
    steps_trained: dict[str, int] | None = None
    groups_replaced: dict[str, int] = field(default_factory=dict[str, int])  # by policy: refill's, so far
    gates_acted: list[str] = field(default_factory=list[str])  # the eval gates that paused it (each once)


def trained_policies(environment: EnvironmentInfo) -> list[str]:
    """The policies a run trains: those of agents neither pinned to a checkpoint nor answered by an external
    model (LiteLLM). A seat played by a command (Claude Code, Codex) trains like a built-in one."""
    found: list[str] = []
    for agent in environment.agents:
        if agent.trainable and agent.policy not in found:
            found.append(agent.policy)
    return found


@workflow.defn(name="RunWorkflow")
class RunWorkflow:
    def __init__(self) -> None:
        self.state = _RunState()
        self.lock = asyncio.Lock()
        self.created = False
        self.started = False

    @workflow.run
    async def run(self, given: RunInput) -> RunStatus:
        self.state.run, self.state.max_lag = given.run, given.settings.max_lag
        environment = await workflow.execute_activity(
            runner_stubs.describe_environment,
            given.environment,
            **heartbeating(timedelta(minutes=2), RetryPolicy(maximum_attempts=3)),
        )
        settings = replace(given.settings, external_models=environment.external_models())
        await workflow.execute_activity(runner_stubs.create_run, replace(given, settings=settings), **QUICK)
        self.created = True
        if given.training is not None:
            self.state.training_policies = trained_policies(environment)
            self.state.groups_per_batch = given.training.groups_per_batch
            self.state.steps_trained = dict.fromkeys(self.state.training_policies, 0)
        supply = await workflow.start_child_workflow(
            EpisodeSupplyWorkflow.run,
            SupplyInput(
                run=given.run,
                environment=environment,
                groups_in_flight=given.groups_in_flight,
                max_groups=given.max_groups,
                allowance=self._allowance(),
                max_failure_rate=given.max_failure_rate,
                failure_window=given.failure_window,
                straggler_floor_s=given.straggler_floor_s,
            ),
            id=supply_workflow_id(given.run),
        )
        self.started = True
        if given.training is not None and given.tracking is not None:
            await workflow.start_child_workflow(
                TrackingWorkflow.run,
                replace(given.tracking, policies=list(self.state.training_policies or [])),
                id=tracking_workflow_id(given.run),
                parent_close_policy=ParentClosePolicy.ABANDON,  # it logs what the run's end recorded
            )
        if given.training is not None:
            training = asyncio.ensure_future(self._train(given.run, environment, given.training))
            done, _ = await workflow.wait([training, supply], return_when=asyncio.FIRST_COMPLETED)
            if training in done:
                training.result()  # a failed training fails the run
                await self._stop_supply()
        self.state.counts = await supply
        self.state.supply_done = True
        return self.status()

    async def _train(self, run: str, environment: EnvironmentInfo, spec: TrainingSpec) -> None:
        policies = self.state.training_policies or []
        handles = []
        for policy in policies:
            given = TrainingInput(
                run=run,
                policy=policy,
                group_size=environment.group_size,
                spec=spec,
                agents=[a.name for a in environment.agents if a.trainable and a.policy == policy],
                parent=spec.warm_start,
                eval_queue=workflow.info().task_queue,
            )
            own = spec.models.get(policy)
            queue = (own.task_queue if own else None) or spec.task_queue  # a trainer of its own, or the run's
            handle = await workflow.start_child_workflow(
                TrainingWorkflow.run, given, id=training_workflow_id(run, policy), task_queue=queue
            )
            handles.append(handle)
        results = await asyncio.gather(*handles)
        self.state.trained = {result.policy: result.newest for result in results}

    def _allowance(self) -> int | None:
        """The supply's bound on groups started, from the fewest steps any trained policy has trained."""
        if not self.state.steps_trained:
            return None
        fewest = min(self.state.steps_trained.values())
        # The most groups any policy's refill replaced: the policy with the fewest steps always gets its
        # batch's replacements, so every policy moves on.
        replaced = max(self.state.groups_replaced.values(), default=0)
        return supply_allowance(fewest, self.state.max_lag, self.state.groups_per_batch, replaced)

    async def _send_allowance(self) -> None:
        allowance = self._allowance()
        if allowance is not None:
            await self._tell_supply(EpisodeSupplyWorkflow.set_allowance, SupplyAllowance(allowance))

    @workflow.signal(name=TRAINING_PROGRESS)
    async def training_progress(self, advanced: TrainingAdvanced) -> None:
        """A training workflow has finished `steps` steps (trained, or skipped) of `policy`, and refill has
        replaced `replaced` tied groups of it (a waiting step's set-aside ones included)."""
        policy, steps, replaced = advanced.policy, advanced.steps, advanced.replaced
        # Under the lock, so allowances reach the supply in the order they were computed (never a stale one
        # last).
        async with self.lock:
            trained = self.state.steps_trained
            if trained is None:
                return
            more_steps = steps > trained.get(policy, 0)
            more_replaced = replaced > self.state.groups_replaced.get(policy, 0)
            if more_steps:
                trained[policy] = steps
            if more_replaced:
                self.state.groups_replaced[policy] = replaced
            if more_steps or more_replaced:
                await self._send_allowance()

    @workflow.signal(name=TRAINING_PAUSED)
    async def training_paused(self, asked: PauseAsked) -> None:
        """A training step could not be published (`reason`): pause the run until `resume`."""
        async with self.lock:
            self.state.training_paused = True
            await self._pause(asked.reason)

    @workflow.signal(name=EPISODES_FAILING)
    async def episodes_failing(self, asked: PauseAsked) -> None:
        """Too many recent episodes failed (`reason`): the supply paused itself; pause the run until
        `resume`."""
        async with self.lock:
            await self._pause(asked.reason)

    @workflow.signal(name=EVAL_GATE_PAUSE)
    async def eval_gate_pause(self, tripped: GateTripped) -> None:
        """An eval's gate tripped (`gate`: suite@version/checkpoint): pause the run until `resume`, once per
        gate."""
        async with self.lock:
            if tripped.gate in self.state.gates_acted:
                return
            self.state.gates_acted.append(tripped.gate)
            await self._pause(tripped.reason)

    async def _pause(self, reason: str | None = None) -> None:
        await self._change(RunSettingsChange(paused=True, pause_reason=reason))
        self.state.paused, self.state.pause_reason = True, reason
        await self._pause_supply(True)

    @workflow.query
    def status(self) -> RunStatus:
        counts = self.state.counts
        return RunStatus(
            run=self.state.run,
            paused=self.state.paused,
            stopped=self.state.stopped,
            max_lag=self.state.max_lag,
            episodes_finished=counts.episodes_finished,
            episodes_failed=counts.episodes_failed,
            groups_finished=counts.groups_finished,
            pause_reason=self.state.pause_reason,
            trained=dict(self.state.trained or {}),
        )

    async def _change(self, changes: RunSettingsChange) -> None:
        # An update that arrives with the run's start waits for RunCreated: a change must follow it in the
        # ledger.
        await workflow.wait_condition(lambda: self.created)
        update = workflow.current_update_info()
        key = update.id if update is not None else str(workflow.uuid4())
        await workflow.execute_activity(
            runner_stubs.change_settings, SettingsChange(self.state.run, key, changes), **QUICK
        )

    async def _supply(self) -> workflow.ExternalWorkflowHandle[EpisodeSupplyWorkflow] | None:
        """The supply, to signal once it has started; None once it has ended (nothing is left to tell it)."""
        await workflow.wait_condition(lambda: self.started or self.state.supply_done)
        if self.state.supply_done:
            return None
        # By id alone (no run id): the supply continues as new, and this reaches whichever run is current.
        return workflow.get_external_workflow_handle_for(
            EpisodeSupplyWorkflow.run, supply_workflow_id(self.state.run)
        )

    async def _tell_supply(self, signal: Any, *args: SupplyAllowance | SupplyPaused) -> None:
        """Signal the supply, unless it has ended: also when it ended after `_supply` looked (the signal then
        finds no workflow, before its completion reaches this one), since nothing is left to tell it."""
        if (supply := await self._supply()) is None:
            return
        try:
            await supply.signal(signal, *args)
        except ApplicationError as error:
            if error.type != "ExternalWorkflowExecutionNotFound":
                raise

    async def _pause_supply(self, paused: bool) -> None:
        await self._tell_supply(EpisodeSupplyWorkflow.set_paused, SupplyPaused(paused))

    async def _stop_supply(self) -> None:
        await self._tell_supply(EpisodeSupplyWorkflow.stop)

    @workflow.update
    async def pause(self) -> RunStatus:
        async with self.lock:
            await self._pause()
            return self.status()

    @workflow.update
    async def resume(self) -> RunStatus:
        async with self.lock:
            # A reason the run paused itself no longer holds.
            await self._change(
                RunSettingsChange(paused=False, pause_reason="" if self.state.pause_reason else None)
            )
            self.state.paused, self.state.pause_reason = False, None
            await self._pause_supply(False)
            if self.state.training_paused:
                self.state.training_paused = False
                for policy in self.state.training_policies or []:
                    training = workflow.get_external_workflow_handle_for(
                        TrainingWorkflow.run, training_workflow_id(self.state.run, policy)
                    )
                    await training.signal(TrainingWorkflow.resume_training)
            return self.status()

    @workflow.update
    async def set_max_lag(self, change: MaxLagChange) -> RunStatus:
        async with self.lock:
            await self._change(RunSettingsChange(max_lag=change.max_lag))
            self.state.max_lag = change.max_lag
            await self._send_allowance()
            return self.status()

    @set_max_lag.validator
    def _check_max_lag(self, change: MaxLagChange) -> None:
        try:
            max_lag_of(change.max_lag)
        except BadRunSetting as error:
            raise ApplicationError(str(error)) from None

    @workflow.update
    async def stop(self) -> RunStatus:
        async with self.lock:
            await self._change(RunSettingsChange(stopped=True))
            self.state.stopped = True
            await self._stop_supply()
            return self.status()
