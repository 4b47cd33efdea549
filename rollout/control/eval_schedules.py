"""Evals on a Temporal Schedule: created, listed, paused, resumed, deleted.

Contract: each firing starts an `EvalWorkflow` (one at a time: a firing while the last eval still plays is
skipped) and resolves the checkpoint anew, so `latest:RUN/POLICY` scores the newest checkpoint then. A
schedule that exists already, or a cron expression Temporal refuses, is a `ControlError`; acting on a schedule
that does not exist is `NotFound`. Schedules are visible, and pausable, in the Temporal web UI too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from rollout.control.connections import connect_temporal, ledger_session
from rollout.control.errors import ControlError, NotFound
from rollout.control.evals import eval_input, suite_named

if TYPE_CHECKING:
    from rollout.config import Settings

ScheduleAction = Literal["pause", "resume", "delete"]


async def create_schedule(
    settings: Settings, suite: str, checkpoint: str, *, cron: str | None, every_s: float | None
) -> str:
    """Schedule `suite` on `checkpoint` by one of `cron` or `every_s`; the schedule's id."""
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleAlreadyRunningError,
        ScheduleIntervalSpec,
        ScheduleOverlapPolicy,
        SchedulePolicy,
        ScheduleSpec,
    )
    from temporalio.service import RPCError

    from rollout.workflows.evals import EvalWorkflow
    from rollout.workflows.names import RUNNER_QUEUE, eval_schedule_id, eval_workflow_id

    if (cron is None) == (every_s is None):
        raise ControlError("give the schedule one of --cron EXPRESSION or --every SECONDS", usage=True)
    async with ledger_session(settings) as ledger:
        chosen = await suite_named(ledger, suite)
    spec = (
        ScheduleSpec(cron_expressions=[cron])
        if cron is not None
        else ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=every_s or 0))])
    )
    schedule_id = eval_schedule_id(chosen.name, checkpoint)
    client = await connect_temporal(settings)
    try:
        await client.create_schedule(
            schedule_id,
            Schedule(
                action=ScheduleActionStartWorkflow(
                    EvalWorkflow.run,
                    eval_input(
                        chosen,
                        checkpoint,
                        max_tokens=settings.run.max_tokens,
                        in_flight=settings.eval.episodes_in_flight,
                    ),
                    id=eval_workflow_id(chosen.name, chosen.version, checkpoint),
                    task_queue=RUNNER_QUEUE,
                ),
                spec=spec,
                policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),  # one eval of a suite at a time
            ),
        )
    except ScheduleAlreadyRunningError:
        raise ControlError(
            f"schedule {schedule_id} exists: delete it first with `rollout eval schedules delete {schedule_id}`"
        ) from None
    except RPCError as error:
        raise ControlError(
            f"Temporal refused the schedule: {error.message} (is the cron expression {cron!r} valid?)"
        ) from None
    return schedule_id


@dataclass(frozen=True)
class ScheduleRow:
    schedule: str
    when: str
    paused: bool
    fired: int
    next: str | None  # ISO time of the next firing


async def schedule_rows(settings: Settings) -> list[ScheduleRow]:
    """Every eval schedule: when it fires, whether it is paused, how often it has fired, when it fires
    next."""
    from rollout.workflows.names import EVAL_SCHEDULES

    client = await connect_temporal(settings)
    rows: list[ScheduleRow] = []
    async for listed in await client.list_schedules():
        if not listed.id.startswith(EVAL_SCHEDULES):
            continue
        described = await client.get_schedule_handle(listed.id).describe()
        spec = described.schedule.spec
        when = ", ".join(spec.cron_expressions) or ", ".join(f"every {i.every}" for i in spec.intervals)
        info = described.info
        upcoming = info.next_action_times[0].isoformat(timespec="seconds") if info.next_action_times else None
        rows.append(ScheduleRow(listed.id, when, described.schedule.state.paused, info.num_actions, upcoming))
    return rows


async def act_on_schedule(settings: Settings, schedule_id: str, action: ScheduleAction) -> None:
    from temporalio.service import RPCError, RPCStatusCode

    handle = (await connect_temporal(settings)).get_schedule_handle(schedule_id)
    try:
        if action == "pause":
            await handle.pause(note="rollout eval schedules pause")
        elif action == "resume":
            await handle.unpause(note="rollout eval schedules resume")
        else:
            await handle.delete()
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            raise NotFound(f"no schedule {schedule_id!r}: `rollout eval schedules list` shows them") from None
        raise
