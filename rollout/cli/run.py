"""`rollout run start|list|status|export|attach|pause|resume|stop|set`: runs, started, followed and changed
while they play (rollout.control.runs does the work; rollout.control.export writes a run's files).

Numbers come from the ledger (what is durable: episodes, groups, batches, checkpoints); the run's workflow
adds what only it knows (paused, stopped, max_lag, whether it still plays). `attach` reattaches to a training
run whose `rollout train` died: it restarts the run's trainer with the settings the run recorded and shows it
live to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from rollout.cli.cluster import ClusterFlag, cluster_overrides
from rollout.cli.common import JsonFlag, Overrides, err, fail, load_settings, out

if TYPE_CHECKING:
    from rollout.run.settings import RunChange

app = typer.Typer(help="Runs: start one, follow it, change it while it plays.", no_args_is_help=True)

RunArgument = Annotated[str, typer.Argument(help="The run's id (`rollout run list` shows them).")]


def steps_said(row: dict[str, Any]) -> str:
    """A run's steps for `run list`: their number, or with several trained policies each one's."""
    policies: dict[str, dict[str, Any]] = row["policies"]
    if len(policies) < 2:
        return str(row["steps"])
    return " · ".join(
        f"{name.removeprefix(row['run'] + '/')} {p['checkpoints']}" for name, p in policies.items()
    )


def policy_lines(curves: dict[str, dict[str, list[float | None]]]) -> list[str]:
    """A line per trained policy for `run status`, side by side: its steps, and each curve drawn with its
    newest value (`rollout.control.runs.policy_curves`)."""
    from rollout.cli.sparkline import sparkline

    width = max((len(name) for name in curves), default=0)
    lines = []
    for name, curve in curves.items():
        count = len(curve["step"])
        parts = [f"  {name:<{width}}  {count} step{'' if count == 1 else 's'}"]
        for label, values in curve.items():
            newest = next((v for v in reversed(values) if v is not None), None)
            if label != "step" and newest is not None:
                parts.append(f"{label} {sparkline(values)} {newest:.3g}")
        lines.append(" · ".join(parts))
    return lines


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
    """Start a run: episodes of ENVIRONMENT, played by runner workers (`rollout worker runner`, or the
    stack's).

    A runner first confirms it can load the environment; if it cannot, nothing starts.
    """
    from rollout.control.runs import start_run

    settings = load_settings(cluster_overrides(cluster, overrides))
    with err.status(f"starting a run of {environment}…") as spinner:
        status = asyncio.run(
            start_run(
                settings,
                environment,
                run=run,
                groups=groups,
                in_flight=in_flight,
                max_lag=max_lag,
                wait=wait,
                report=lambda line: spinner.update(line or "waiting for the run to end…"),
            )
        )
    _print_status(status, as_json)


@app.command("list")
def list_(overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False) -> None:
    """Every run the ledger holds, newest first: its environment, state, episodes and steps."""
    from rollout.control.runs import run_rows

    settings = load_settings(cluster_overrides(cluster, overrides))
    rows = asyncio.run(run_rows(settings))
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
            steps_said(row),
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
    """Where a run is, from the ledger: episodes finished and failed, groups, batches (and skipped ones, and
    the tied groups refill replaced), steps; and from its workflow while it plays: paused, max_lag."""
    from rollout.control.runs import run_rows

    settings = load_settings(cluster_overrides(cluster, overrides))
    try:
        while True:
            row = asyncio.run(run_rows(settings, run))[0]
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
                    )
                    + (f" · refilled {row['groups_replaced']}" if row["groups_replaced"] else ""),
                    highlight=False,
                )
                for line in policy_lines(row["curves"]):
                    out.print(line, highlight=False, markup=False)
                if row["tracking"] is not None:
                    out.print(f"  {row['tracking']['said']}", highlight=False, markup=False)
                for failed in row["failures"]:
                    out.print(
                        f"  {failed['count']} failed · {failed['kind'] or 'failed'}: {failed['summary']} (e.g. "
                        f"episode {failed['episode']})",
                        highlight=False,
                        markup=False,
                    )
            if not watch:
                return
            time.sleep(2.0)
    except KeyboardInterrupt:
        pass


@app.command("export")
def export(
    run: RunArgument,
    file_format: Annotated[
        str, typer.Option("--format", help="jsonl (one JSON object a line) or parquet (needs pyarrow).")
    ] = "jsonl",
    directory: Annotated[
        Path | None, typer.Option("--out", help="Where to write the files (default: ./RUN-export).")
    ] = None,
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Write a run's steps (one record per step: reward, loss, KL, entropy, tokens, …) and its episodes
    (rewards, turns, failures) to steps.FORMAT and episodes.FORMAT, for pandas, DuckDB or any other tool."""
    from rollout.control.export import export_run

    settings = load_settings(cluster_overrides(cluster, overrides))
    target = directory if directory is not None else Path(f"{run}-export")
    exported = export_run(settings, run, target, file_format)
    if as_json:
        print(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(exported).items()}))
        return
    out.print(f"{exported.step_rows} steps → {exported.steps}", highlight=False)
    out.print(f"{exported.episode_rows} episodes → {exported.episodes}", highlight=False)


@app.command("attach")
def attach(
    run: RunArgument,
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Reattach to a training run (after its `rollout train` died or the stack was stopped): bring the stack
    to the run's recorded settings (an engine and gateway serving another model restart on the run's, its
    trainer restarts with the run's trainer settings), resume it if it was paused, and show it live until it
    ends. Ctrl-C pauses it again. With --cluster, a run on the current cluster context: its trainer is the
    cluster's, and nothing is restarted here."""
    from rollout.cli.live import follow_to_the_end
    from rollout.control.runs import bring_stack_to, reattach, recorded_launch

    overrides = cluster_overrides(cluster, overrides)
    launch = asyncio.run(recorded_launch(load_settings(overrides), run))
    settings = load_settings([*launch.overrides, *(overrides or [])])
    if not cluster:
        with err.status(f"bringing the stack to run {run}'s settings…") as spinner:
            bring_stack_to(settings, launch, report=lambda line: spinner.update(line))
    policies = asyncio.run(reattach(settings, run))
    follow_to_the_end(settings, run, policies, as_json=as_json, embedded=not cluster)


def update_run(overrides: list[str] | None, run: str, change: RunChange) -> dict[str, object]:
    from rollout.control.runs import update_run as send

    settings = load_settings(overrides)
    with err.status(f"run {run}: {change.label}…") as spinner:
        status = asyncio.run(
            send(
                settings,
                run,
                change,
                report=lambda line: spinner.update(line or f"run {run}: {change.label}…"),
            )
        )
    return asdict(status)


@app.command("pause")
def pause(
    run: RunArgument, overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False
) -> None:
    """Pause a run: no new turns or episodes begin; recorded in the ledger."""
    from rollout.run.settings import PauseRun

    _print_status(update_run(cluster_overrides(cluster, overrides), run, PauseRun()), as_json)


@app.command("stop")
def stop(
    run: RunArgument, overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False
) -> None:
    """Stop a run once the episodes in flight finish."""
    from rollout.run.settings import StopRun

    _print_status(update_run(cluster_overrides(cluster, overrides), run, StopRun()), as_json)


@app.command("resume")
def resume(
    run: RunArgument, overrides: Overrides = None, cluster: ClusterFlag = False, as_json: JsonFlag = False
) -> None:
    """Resume a paused run. A training run whose model the stack's engine does not serve (a stack started
    again with other settings) is not resumed: `rollout run attach RUN` brings the stack to the run's
    model."""
    from rollout.control.runs import refuse_a_stack_serving_another_model

    overrides = cluster_overrides(cluster, overrides)
    if not cluster:
        asyncio.run(refuse_a_stack_serving_another_model(load_settings(overrides), run))
    from rollout.run.settings import ResumeRun

    _print_status(update_run(overrides, run, ResumeRun()), as_json)


@app.command("set")
def set_(
    run: RunArgument,
    setting: Annotated[str, typer.Argument(help="max_lag=N")],
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Change a run's setting while it plays (max_lag=N); the gateway applies it on the next turn."""
    from rollout.run.settings import BadRunSetting, MaxLagChange, max_lag_of

    key, _, value = setting.partition("=")
    if key != "max_lag":
        fail(f"{setting!r}: the setting a run takes while it plays is max_lag=N (0 = on-policy)", code=2)
    given: object = value
    with contextlib.suppress(ValueError):
        given = int(value)
    try:
        lag = max_lag_of(given, "max_lag")
    except BadRunSetting as error:
        fail(str(error), code=2)
    _print_status(update_run(cluster_overrides(cluster, overrides), run, MaxLagChange(lag)), as_json)
