"""`RunWorkflow` (`run/{run}`): owns a run. It checks the environment, records the run, starts the episode
supply, and takes the run's updates.

Contract:
- Updates `pause`, `resume`, `set_max_lag(n)` and `stop` are validated, recorded in the ledger first
  (`SettingsChanged` on `run/{run}`, keyed by the update's id, so a retried update records once), then applied:
  the gateway reads max_lag and pause from the ledger on the next turn, and the supply starts no new group
  while paused. Updates are serialised by a lock; queries (`status`) keep working while paused.
- An update that arrives before the run is recorded waits for it, so `SettingsChanged` always follows
  `RunCreated` in the ledger.
- The run ends when the supply has played `max_groups` groups, or after `stop` once the groups in flight
  finish. It returns its final status.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from rollout.workflows.episodes import SHORT
from rollout.workflows.types import EnvironmentInfo, RunInput, RunStatus, SettingsChange, SupplyInput


def run_workflow_id(run: str) -> str:
    return f"run/{run}"


def supply_workflow_id(run: str) -> str:
    return f"run/{run}/supply"


@dataclass
class _RunState:
    run: str = ""
    paused: bool = False
    stopped: bool = False
    max_lag: int = 0
    supply_done: bool = False
    counts: dict[str, int] | None = None


@workflow.defn(name="RunWorkflow")
class RunWorkflow:
    def __init__(self) -> None:
        self.state = _RunState()
        self.lock = asyncio.Lock()
        self.created = False
        self.started = False

    @workflow.run
    async def run(self, given: RunInput) -> RunStatus:
        self.state.run, self.state.max_lag = given.run, given.max_lag
        environment: EnvironmentInfo = await workflow.execute_activity(
            "describe_environment", given.environment, result_type=EnvironmentInfo,
            start_to_close_timeout=timedelta(minutes=2), retry_policy=RetryPolicy(maximum_attempts=3),
        )  # fmt: skip
        await workflow.execute_activity("create_run", given, **SHORT)
        self.created = True
        supply = await workflow.start_child_workflow(
            "EpisodeSupplyWorkflow",
            SupplyInput(given.run, environment, given.groups_in_flight, given.max_groups),
            id=supply_workflow_id(given.run),
            result_type=dict[str, int],
        )
        self.started = True
        self.state.counts = await supply
        self.state.supply_done = True
        return self.status()

    @workflow.query
    def status(self) -> RunStatus:
        counts = self.state.counts or {}
        return RunStatus(self.state.run, self.state.paused, self.state.stopped, self.state.max_lag,
                         counts.get("episodes_finished", 0), counts.get("episodes_failed", 0),
                         counts.get("finished_groups", 0))  # fmt: skip

    async def _change(self, changes: dict[str, bool | int | float | str]) -> None:
        # An update that arrives with the run's start waits for RunCreated: a change must follow it in the ledger.
        await workflow.wait_condition(lambda: self.created)
        update = workflow.current_update_info()
        key = update.id if update is not None else str(workflow.uuid4())
        await workflow.execute_activity(
            "change_settings", SettingsChange(self.state.run, key, changes), **SHORT
        )

    async def _signal_supply(self, name: str, *args: bool) -> None:
        await workflow.wait_condition(lambda: self.started or self.state.supply_done)
        if not self.state.supply_done:
            await workflow.get_external_workflow_handle(supply_workflow_id(self.state.run)).signal(
                name, args=list(args)
            )

    @workflow.update
    async def pause(self) -> RunStatus:
        async with self.lock:
            await self._change({"paused": True})
            self.state.paused = True
            await self._signal_supply("set_paused", True)
            return self.status()

    @workflow.update
    async def resume(self) -> RunStatus:
        async with self.lock:
            await self._change({"paused": False})
            self.state.paused = False
            await self._signal_supply("set_paused", False)
            return self.status()

    @workflow.update
    async def set_max_lag(self, max_lag: int) -> RunStatus:
        async with self.lock:
            await self._change({"max_lag": max_lag})
            self.state.max_lag = max_lag
            return self.status()

    @set_max_lag.validator
    def _check_max_lag(self, max_lag: int) -> None:
        if not isinstance(max_lag, int) or isinstance(max_lag, bool) or max_lag < 0:
            raise ApplicationError(
                f"max_lag must be a whole number of checkpoints, 0 or more, not {max_lag!r}"
            )

    @workflow.update
    async def stop(self) -> RunStatus:
        async with self.lock:
            await self._change({"stopped": True})
            self.state.stopped = True
            await self._signal_supply("stop")
            return self.status()
