"""`rollout eval schedule` and `rollout eval schedules list|pause|resume|delete`: evals on a Temporal Schedule.

Each firing starts an `EvalWorkflow` (one at a time: a firing while the last eval still plays is skipped) and
resolves the checkpoint anew, so `latest:RUN/POLICY` scores the newest checkpoint then. Schedules are visible, and
pausable, in the Temporal web UI too. Registered on the `rollout eval` group by rollout.cli.evals.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from rollout.cli.cluster import ClusterFlag, cluster_overrides
from rollout.cli.common import JsonFlag, Overrides, connect_temporal, fail, ledger_call, load_settings, out
from rollout.cli.evals import CheckpointOption, SuiteArgument, eval_input, suite_named

if TYPE_CHECKING:
    from rollout.config import Settings

schedules = typer.Typer(help="The eval schedules: list, pause, resume, delete.", no_args_is_help=True)

ScheduleArgument = Annotated[str, typer.Argument(help="The schedule's id (`rollout eval schedules list`).")]


def schedule(
    suite: SuiteArgument,
    overrides: Overrides = None,
    checkpoint: CheckpointOption = "base",
    cron: Annotated[
        str | None, typer.Option("--cron", help='A cron expression, e.g. "0 * * * *" (every hour, UTC).')
    ] = None,
    every: Annotated[
        float | None, typer.Option("--every", help="Or an interval in seconds between evals.", min=1)
    ] = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Evaluate SUITE on a schedule (a Temporal Schedule): each time it fires, the checkpoint is resolved anew (so
    latest:RUN/POLICY scores the newest checkpoint then; one already scored records nothing new)."""
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

    from rollout.ledger import Ledger
    from rollout.workflows.evals import EvalWorkflow
    from rollout.workflows.names import RUNNER_QUEUE, eval_schedule_id, eval_workflow_id

    if (cron is None) == (every is None):
        fail("give the schedule one of --cron EXPRESSION or --every SECONDS", code=2)
    settings = load_settings(cluster_overrides(cluster, overrides))

    async def create() -> str:
        from datetime import timedelta

        async with await Ledger.connect(settings.ledger_url) as ledger:
            chosen = await suite_named(ledger, suite)
        spec = (
            ScheduleSpec(cron_expressions=[cron])
            if cron is not None
            else ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=every or 0))])
        )
        schedule_id = eval_schedule_id(chosen.name, checkpoint)
        client = await connect_temporal(settings)
        try:
            await client.create_schedule(
                schedule_id,
                Schedule(
                    action=ScheduleActionStartWorkflow(
                        EvalWorkflow.run,
                        eval_input(chosen, checkpoint, max_tokens=settings.run.max_tokens),
                        id=eval_workflow_id(chosen.name, chosen.version, checkpoint),
                        task_queue=RUNNER_QUEUE,
                    ),
                    spec=spec,
                    policy=SchedulePolicy(
                        overlap=ScheduleOverlapPolicy.SKIP
                    ),  # one eval of a suite at a time
                ),
            )
        except ScheduleAlreadyRunningError:
            fail(
                f"schedule {schedule_id} exists: delete it first with `rollout eval schedules delete {schedule_id}`"
            )
        except RPCError as error:
            fail(f"Temporal refused the schedule: {error.message} (is the cron expression {cron!r} valid?)")
        return schedule_id

    schedule_id = ledger_call(create())
    if as_json:
        print(json.dumps({"schedule": schedule_id}))
        return
    out.print(
        f"created schedule {schedule_id}: pause it with `rollout eval schedules pause {schedule_id}` or in the "
        f"Temporal web UI ({settings.temporal_ui_url}/namespaces/{settings.services.temporal.namespace}/schedules)",
        highlight=False,
    )


async def _schedule_rows(settings: Settings) -> list[dict[str, Any]]:
    from rollout.workflows.names import EVAL_SCHEDULES

    client = await connect_temporal(settings)
    rows: list[dict[str, Any]] = []
    async for listed in await client.list_schedules():
        if not listed.id.startswith(EVAL_SCHEDULES):
            continue
        described = await client.get_schedule_handle(listed.id).describe()
        spec = described.schedule.spec
        when = ", ".join(spec.cron_expressions) or ", ".join(f"every {i.every}" for i in spec.intervals)
        info = described.info
        rows.append(
            {
                "schedule": listed.id,
                "when": when,
                "paused": described.schedule.state.paused,
                "fired": info.num_actions,
                "next": info.next_action_times[0].isoformat(timespec="seconds")
                if info.next_action_times
                else None,
            }
        )
    return rows


@schedules.command("list")
def schedules_list(
    overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False
) -> None:
    """Every eval schedule: when it fires, whether it is paused, how often it has fired, when it fires next."""
    settings = load_settings(cluster_overrides(cluster, overrides))
    rows = asyncio.run(_schedule_rows(settings))
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        out.print("no eval schedules: `rollout eval schedule SUITE --cron ... --checkpoint ...` creates one")
        return
    table = Table(title="eval schedules")
    for column in ("schedule", "when", "paused", "fired", "next"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(str(row[c]) for c in ("schedule", "when", "paused", "fired", "next")))
    out.print(table)


def _on_schedule(overrides: list[str], schedule_id: str, action: str) -> None:
    from temporalio.service import RPCError, RPCStatusCode

    settings = load_settings(overrides)

    async def act() -> None:
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
                fail(f"no schedule {schedule_id!r}: `rollout eval schedules list` shows them")
            raise

    asyncio.run(act())
    out.print(f"{action}d {schedule_id}" if action != "resume" else f"resumed {schedule_id}", highlight=False)


@schedules.command("pause")
def schedules_pause(
    schedule_id: ScheduleArgument, overrides: Overrides = None, cluster: ClusterFlag = False
) -> None:
    """Stop a schedule from firing until it is resumed."""
    _on_schedule(cluster_overrides(cluster, overrides), schedule_id, "pause")


@schedules.command("resume")
def schedules_resume(
    schedule_id: ScheduleArgument, overrides: Overrides = None, cluster: ClusterFlag = False
) -> None:
    """Let a paused schedule fire again."""
    _on_schedule(cluster_overrides(cluster, overrides), schedule_id, "resume")


@schedules.command("delete")
def schedules_delete(
    schedule_id: ScheduleArgument, overrides: Overrides = None, cluster: ClusterFlag = False
) -> None:
    """Delete a schedule (the results it recorded stay in the ledger)."""
    _on_schedule(cluster_overrides(cluster, overrides), schedule_id, "delete")
