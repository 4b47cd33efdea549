"""`rollout eval schedule` and `rollout eval schedules list|pause|resume|delete`: evals on a Temporal Schedule
(rollout.control.eval_schedules does the work), added to the `rollout eval` group by `register`.

Each firing resolves the checkpoint anew, so `latest:RUN/POLICY` scores the newest checkpoint then. Schedules
are visible, and pausable, in the Temporal web UI too.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from rollout.cli import evals
from rollout.cli.cluster import ClusterFlag, cluster_overrides
from rollout.cli.common import JsonFlag, Overrides, load_settings, out
from rollout.cli.evals import CheckpointOption, SuiteArgument

if TYPE_CHECKING:
    from rollout.control.eval_schedules import ScheduleAction

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
    """Evaluate SUITE on a schedule (a Temporal Schedule): each time it fires, the checkpoint is resolved anew
    (so latest:RUN/POLICY scores the newest checkpoint then; one already scored records nothing new)."""
    from rollout.control.eval_schedules import create_schedule

    settings = load_settings(cluster_overrides(cluster, overrides))
    schedule_id = asyncio.run(create_schedule(settings, suite, checkpoint, cron=cron, every_s=every))
    if as_json:
        print(json.dumps({"schedule": schedule_id}))
        return
    out.print(
        f"created schedule {schedule_id}: pause it with `rollout eval schedules pause {schedule_id}` or in the "
        f"Temporal web UI ({settings.temporal_ui_url}/namespaces/{settings.services.temporal.namespace}/schedules)",
        highlight=False,
    )


@schedules.command("list")
def schedules_list(
    overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False
) -> None:
    """Every eval schedule: when it fires, whether it is paused, how often it has fired, when it fires
    next."""
    from rollout.control.eval_schedules import schedule_rows

    settings = load_settings(cluster_overrides(cluster, overrides))
    rows = [asdict(row) for row in asyncio.run(schedule_rows(settings))]
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


def _on_schedule(overrides: list[str], schedule_id: str, action: ScheduleAction) -> None:
    from rollout.control.eval_schedules import act_on_schedule

    asyncio.run(act_on_schedule(load_settings(overrides), schedule_id, action))
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


def register(app: typer.Typer) -> None:
    """Add the `rollout eval` group (with `schedule` and `schedules`) to `app`."""
    evals.app.command("schedule")(schedule)
    evals.app.add_typer(schedules, name="schedules")
    app.add_typer(evals.app, name="eval")
