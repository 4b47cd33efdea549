"""`rollout run start|list|status|attach|pause|resume|stop|set`: runs, started, followed and changed while
they play.

Numbers come from the ledger (what is durable: episodes, groups, batches, checkpoints); the run's workflow
adds what only it knows (paused, stopped, max_lag, whether it still plays). `attach` reattaches to a training
run whose `rollout train` died: it restarts the run's trainer with the settings the run recorded and shows it
live to the end.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from rollout.cli.cluster import ClusterFlag, cluster_overrides
from rollout.cli.common import (
    JsonFlag,
    Overrides,
    connect_temporal,
    err,
    fail,
    ledger_call,
    load_settings,
    out,
)

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.ledger.queries import RunProgress, RunRow
    from rollout.workflows.client import RunUpdate
    from rollout.workflows.types import RunStatus

app = typer.Typer(help="Runs: start one, follow it, change it while it plays.", no_args_is_help=True)

RunArgument = Annotated[str, typer.Argument(help="The run's id (`rollout run list` shows them).")]


async def _update(settings: Settings, run: str, update: RunUpdate, *args: int) -> dict[str, object]:
    from rollout.workflows.client import RunNotPlaying, RunUpdateRefused
    from rollout.workflows.client import update_run as send_update

    client = await connect_temporal(settings)
    try:
        status = await send_update(client, run, update, *args)
    except RunUpdateRefused as error:
        fail(f"run {run} refused {update}: {error}")
    except RunNotPlaying as error:
        fail(f"{error}: `rollout run list` shows the runs, `rollout run start` starts one")
    return asdict(status)


def _print_status(status: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(status))
        return
    out.print(describe_status(status), highlight=False)


def describe_status(status: dict[str, object]) -> str:
    """The line a person reads after `run start|pause|resume|stop|set`: what the run does now, its max_lag and
    its newest checkpoints (`--json` prints the status itself)."""
    run = status["run"]
    if "paused" not in status:  # just started, not waited for
        return f"run [bold]{run}[/] started; `rollout run status {run}` shows it, `rollout run stop {run}` stops it"
    state = "stopped" if status["stopped"] else "paused" if status["paused"] else "playing"
    if status["paused"] and status.get("pause_reason"):
        state += f" ({status['pause_reason']})"
    trained = status.get("trained")
    pairs = trained.items() if isinstance(trained, dict) else ()
    newest = ", ".join(f"{policy} at {name}" for policy, name in pairs if name)
    line = f"run [bold]{run}[/] {state} · max_lag {status['max_lag']} · {newest or 'no checkpoint yet'}"
    if status["stopped"]:
        line += f" · {status['episodes_finished']} episodes ({status['episodes_failed']} failed)"
    return line


@app.command("start")
def start(
    environment: Annotated[str, typer.Argument(help="The environment, as package.module:attribute.")],
    overrides: Overrides = None,
    run: Annotated[str | None, typer.Option("--run", help="The run's id (default: a new one).")] = None,
    groups: Annotated[
        int | None, typer.Option(help="Stop after this many groups (default: until stopped).")
    ] = None,
    in_flight: Annotated[
        int | None,
        typer.Option(help="Episode groups to keep playing at once (default: run.groups_in_flight)."),
    ] = None,
    max_lag: Annotated[
        int | None,
        typer.Option(help="How many checkpoints behind the newest a turn may sample (default: run.max_lag)."),
    ] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the run to end and print its status.")] = False,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Start a run: episodes of ENVIRONMENT, played by runner workers (`rollout worker runner`, or the stack's).

    A runner first confirms it can load the environment; if it cannot, nothing starts.
    """
    from rollout.cli.preflight import PreflightFailed, confirm_runner_loads
    from rollout.run_settings import BadRunSetting, max_lag_of
    from rollout.workflows.client import start_run
    from rollout.workflows.types import RunInput

    if max_lag is not None:
        try:
            max_lag_of(max_lag, "--max-lag")
        except BadRunSetting as error:
            fail(str(error), code=2)
    settings = load_settings(cluster_overrides(cluster, overrides))
    run_id = run or f"run-{uuid.uuid4().hex[:8]}"
    given = RunInput(
        run=run_id,
        environment=environment,
        groups_in_flight=settings.run.groups_in_flight if in_flight is None else in_flight,
        max_groups=groups,
        max_lag=settings.run.max_lag if max_lag is None else max_lag,
        settings={"max_tokens": settings.run.max_tokens},
    )

    async def begin() -> dict[str, object]:
        client = await connect_temporal(settings)
        try:
            await confirm_runner_loads(client, run_id, environment)
        except PreflightFailed as error:
            fail(str(error), code=2)
        handle = await start_run(client, given)
        if not wait:
            return {"run": run_id, "workflow": handle.id}
        return asdict(await handle.result())

    _print_status(asyncio.run(begin()), as_json)


def _state_word(state: str, status: RunStatus | None) -> str:
    if status is not None:
        if status.pause_reason:
            return "paused (" + status.pause_reason + ")"
        return "paused" if status.paused else "stopping" if status.stopped else "playing"
    words = {
        "COMPLETED": "finished",
        "MISSING": "gone",
        "NO_WORKER": "waiting for a worker (`rollout up`)",
        "UNANSWERED": "running (its worker did not answer in time)",
    }
    return words.get(state, state.lower())


def _row(run: RunRow, progress: RunProgress, state: str, status: RunStatus | None) -> dict[str, Any]:
    return {
        "run": run.run,
        "environment": run.environment,
        "created_at": run.created_at.isoformat(timespec="seconds"),
        "state": _state_word(state, status),
        "max_lag": status.max_lag if status is not None else run.settings.get("max_lag"),
        "episodes_finished": progress.episodes_finished,
        "episodes_failed": progress.episodes_failed,
        "groups_recorded": progress.groups_recorded,
        "steps": sum(p.checkpoints for p in progress.policies.values()),
        "batches_skipped": sum(p.batches_skipped for p in progress.policies.values()),
        "policies": {name: asdict(p) for name, p in progress.policies.items()},
    }


async def _rows(settings: Settings, only: str | None) -> list[dict[str, Any]]:
    from rollout.ledger import Ledger
    from rollout.ledger.queries import find_run, list_runs, run_progress
    from rollout.workflows.client import run_state

    client = await connect_temporal(settings)
    async with await Ledger.connect(settings.ledger_url) as ledger:
        if only is None:
            runs = await list_runs(ledger)
        else:
            found = await find_run(ledger, only)
            if found is None:
                fail(f"the ledger has no run {only!r}: `rollout run list` shows the runs it has")
            runs = [found]
        rows = []
        for run in runs:
            state, status = await run_state(client, run.run)
            rows.append(_row(run, await run_progress(ledger, run.run), state, status))
        return rows


@app.command("list")
def list_(overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False) -> None:
    """Every run the ledger holds, newest first: its environment, state, episodes and steps."""
    settings = load_settings(cluster_overrides(cluster, overrides))
    rows: list[dict[str, Any]] = ledger_call(_rows(settings, None))
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        out.print("no runs yet: `rollout train ENV` or `rollout run start ENV` starts one")
        return
    table = Table(title="runs")
    for column in ("run", "environment", "created", "state", "episodes", "steps"):
        table.add_column(column, overflow="fold")
    for row in rows:
        failed = f" ({row['episodes_failed']} failed)" if row["episodes_failed"] else ""
        table.add_row(
            row["run"],
            row["environment"],
            row["created_at"],
            row["state"],
            f"{row['episodes_finished']}{failed}",
            str(row["steps"]),
        )
    out.print(table)


@app.command("status")
def status(
    run: RunArgument,
    overrides: Overrides = None,
    watch: Annotated[bool, typer.Option("--watch", help="Keep refreshing every 2 s until Ctrl-C.")] = False,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Where a run is, from the ledger: episodes finished and failed, groups, batches (and skipped ones), steps;
    and from its workflow while it plays: paused, max_lag."""
    settings = load_settings(cluster_overrides(cluster, overrides))
    try:
        while True:
            row = ledger_call(_rows(settings, run))[0]
            if as_json:
                print(json.dumps(row), flush=True)
            else:
                stamp = time.strftime("%H:%M:%S")
                out.print(
                    f"[{stamp}] run [bold]{row['run']}[/] {row['state']} · max_lag {row['max_lag']} · "
                    f"{row['episodes_finished']} episodes ({row['episodes_failed']} failed) · "
                    f"{row['groups_recorded']} groups · {row['steps']} steps"
                    + (
                        f" · {row['batches_skipped']} batches skipped (no signal)"
                        if row["batches_skipped"]
                        else ""
                    ),
                    highlight=False,
                )
            if not watch:
                return
            time.sleep(2.0)
    except KeyboardInterrupt:
        pass


@app.command("attach")
def attach(
    run: RunArgument,
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Reattach to a training run (after its `rollout train` died): restart its trainer with the settings the
    run recorded, and show it live until it ends. Ctrl-C pauses it again. With --cluster, a run on the current
    cluster context: its trainer is the cluster's, and nothing is restarted here."""
    from rollout.cli.train import follow_to_the_end
    from rollout.cli.training_view import recorded_trainer_overrides
    from rollout.ledger import Ledger
    from rollout.ledger.queries import find_run
    from rollout.stack.embedded import Stack

    overrides = cluster_overrides(cluster, overrides)
    settings = load_settings(overrides)

    async def recorded() -> dict[str, Any] | None:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            found = await find_run(ledger, run)
        return None if found is None else dict(found.settings)

    run_settings = ledger_call(recorded())
    if run_settings is None:
        fail(f"the ledger has no run {run!r}: `rollout run list` shows the runs it has")
    trainer = recorded_trainer_overrides(run_settings)
    if not trainer:
        fail(
            f"run {run} trains nothing (it was started by `rollout run start`): follow it with `rollout run status {run} --watch`"
        )
    settings = load_settings([*trainer, *(overrides or [])])
    state, status_ = asyncio.run(_workflow_state(settings, run))
    if state == "UNANSWERED":
        fail(
            f"run {run}'s workflow did not answer in time (its worker is busy or stuck): try `rollout run attach {run}` again"
        )
    if state != "RUNNING" or status_ is None:
        fail(
            f"run {run} is not playing (its workflow is {_state_word(state, None)}): `rollout run status {run}` shows where it ended"
        )
    if not cluster:
        try:
            with err.status("trainer: starting with the run's settings…"):
                Stack(settings).start_trainer()
        except RuntimeError as error:
            fail(str(error))
    if status_.paused and not status_.pause_reason:
        update_run(settings, run, "resume")
    policy = next(iter(status_.trained), "default")
    follow_to_the_end(settings, run, policy, as_json=as_json)


async def _workflow_state(settings: Settings, run: str) -> tuple[str, RunStatus | None]:
    from rollout.workflows.client import run_state

    return await run_state(await connect_temporal(settings), run)


def update_run(settings: Settings, run: str, update: RunUpdate, *args: int) -> dict[str, object]:
    return asyncio.run(_update(settings, run, update, *args))


def _simple_update(update: RunUpdate, help_text: str) -> None:
    def command(
        run: RunArgument, overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False
    ) -> None:
        _print_status(update_run(load_settings(cluster_overrides(cluster, overrides)), run, update), as_json)

    command.__doc__ = help_text
    app.command(update)(command)


_simple_update("pause", "Pause a run: no new turns or episodes begin; recorded in the ledger.")
_simple_update("resume", "Resume a paused run.")
_simple_update("stop", "Stop a run once the episodes in flight finish.")


@app.command("set")
def set_(
    run: RunArgument,
    setting: Annotated[str, typer.Argument(help="max_lag=N")],
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Change a run's setting while it plays (max_lag=N); the gateway applies it on the next turn."""
    key, _, value = setting.partition("=")
    if key != "max_lag" or not value.strip().isdigit():
        fail(
            f"{setting!r}: the setting a run takes is max_lag=N, with N a whole number (0 = on-policy)",
            code=2,
        )
    settings = load_settings(cluster_overrides(cluster, overrides))
    _print_status(update_run(settings, run, "set_max_lag", int(value)), as_json)
