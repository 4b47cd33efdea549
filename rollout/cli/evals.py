"""`rollout eval register|run|results|compare|schedule|schedules`: versioned suites scored on checkpoints.

A suite is named `NAME` (its newest registered version), `NAME@VERSION`, a YAML or Python file, or a shipped
suite (`smoke`); files and shipped suites are registered on first use. Scores live in the ledger (one
`EvalResult` per suite version, checkpoint and environment); the runs are `EvalWorkflow`s on the runners, and
schedules are Temporal Schedules (rollout.cli.eval_schedules), visible and pausable in the Temporal web UI too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from rollout.cli.cluster import ClusterFlag, cluster_overrides
from rollout.cli.common import (
    JsonFlag,
    Overrides,
    connect_temporal,
    err,
    fail,
    guarded,
    ledger_call,
    load_settings,
    out,
)

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.evals import EvalResult, Suite
    from rollout.ledger import Ledger
    from rollout.stack.embedded import Stack
    from rollout.workflows.types import EvalInput, EvalOutcome

app = typer.Typer(
    help="Evals: versioned suites of environments, scored on any checkpoint, now or on a schedule.",
    no_args_is_help=True,
)

SuiteArgument = Annotated[
    str,
    typer.Argument(help="NAME, NAME@VERSION, a suite file (.yaml or .py), or a shipped suite (smoke)."),
]
CheckpointOption = Annotated[
    str,
    typer.Option(
        "--checkpoint",
        help="base (the base model), a checkpoint's name (RUN/POLICY-step000004), or latest:RUN/POLICY.",
    ),
]


def eval_input(
    suite: Suite,
    checkpoint: str,
    *,
    max_tokens: int | None = None,
    bridge_formats: list[str] | None = None,
    served_wait_s: float = 600.0,
) -> EvalInput:
    """The `EvalWorkflow` input that scores `suite` on `checkpoint` (a reference, resolved when it runs);
    `max_tokens` caps the turns of environments whose suite sets none (`run.max_tokens`); a checkpoint with no
    serving target is bridged to `bridge_formats` (default: lora)."""
    from rollout.workflows.types import EvalInput, EvalTarget

    targets = [
        EvalTarget(
            name=e.name,
            reference=e.environment,
            episodes=e.episodes,
            tasks=e.tasks,
            first=e.first,
            temperature=float(e.temperature),
            max_tokens=e.max_tokens,
            metric=e.metric,
            threshold=float(e.threshold),
        )
        for e in suite.environments
    ]
    return EvalInput(
        suite=suite.name,
        version=suite.version,
        suite_hash=suite.content_hash(),
        environments=targets,
        checkpoint=checkpoint,
        served_wait_s=served_wait_s,
        default_max_tokens=max_tokens,
        bridge_formats=bridge_formats or ["lora"],
    )


async def suite_named(ledger: Ledger, source: str) -> Suite:
    """The suite `source` names, registering a file's or a shipped suite on first use; `fail`s with the reason."""
    from rollout.evals import SuiteError, SuiteVersionTaken, UnknownSuite, load_suite
    from rollout.evals.records import find_suite, register
    from rollout.evals.suites import SHIPPED

    name, _, version = source.partition("@")
    if not (source.endswith((".yaml", ".yml", ".py")) or ":" in source):
        if (SHIPPED / f"{name}.yaml").is_file():
            # The shipped version is registered before the name is looked up, so a release that ships a new
            # version makes it the newest; a version the ledger holds with other content keeps that content.
            with contextlib.suppress(SuiteVersionTaken):
                await register(ledger, _checked(load_suite(name)))
        try:
            return await find_suite(ledger, name, version or None)
        except UnknownSuite as error:
            fail(str(error))
    try:
        suite = _checked(load_suite(source))
    except SuiteError as error:
        fail(str(error))
    try:
        await register(ledger, suite)
    except SuiteVersionTaken as error:
        fail(str(error))
    return suite


def _checked(suite: Suite) -> Suite:
    """`suite`, once every environment of it loads here and can give the suite's tasks; `fail`s naming the one
    that cannot (nothing is recorded)."""
    from rollout.environment import EnvironmentLoadError, load_environment

    for entry in suite.environments:
        try:
            environment = load_environment(entry.environment)
            environment.task_source(entry.tasks)
        except (EnvironmentLoadError, ValueError) as error:
            fail(f"suite {suite.ref}, environment {entry.name!r}: {error}")
    return suite


@app.command("register")
def register_(
    file: Annotated[str, typer.Argument(help="A suite file (.yaml or .py), or package.module:attribute.")],
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Record a suite version in the ledger under NAME@VERSION with its content hash. Registering the same
    content again changes nothing; other content under a registered version is refused: bump the version."""
    from rollout.evals import SuiteError, SuiteVersionTaken, load_suite
    from rollout.evals.records import register
    from rollout.ledger import Ledger

    settings = load_settings(cluster_overrides(cluster, overrides))
    try:
        suite = load_suite(file)
    except SuiteError as error:
        fail(str(error))
    _checked(suite)

    async def record() -> bool:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            try:
                return await register(ledger, suite)
            except SuiteVersionTaken as error:
                fail(str(error))

    new = ledger_call(record())
    summary = {"suite": suite.ref, "content_hash": suite.content_hash(), "registered": new}
    if as_json:
        print(json.dumps(summary))
        return
    said = "registered" if new else "already registered, with the same content:"
    out.print(f"{said} {suite.ref} (sha256 {suite.content_hash()[:12]})", highlight=False)


@app.command("run")
def run_(
    suite: SuiteArgument,
    overrides: Overrides = None,
    checkpoint: CheckpointOption = "base",
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Score SUITE on one checkpoint and print a score per environment (with its 95% interval). Starts what
    is missing of the embedded stack (with --cluster, the cluster's runners play it and nothing starts here). A
    suite version already scored on that checkpoint is not played again: its recorded scores are shown."""
    from rollout.stack.embedded import Stack

    settings = load_settings(cluster_overrides(cluster, overrides))
    stack = None if cluster else Stack(settings)
    if stack is not None:
        with err.status("starting the stack…") as spinner:
            guarded(lambda: stack.up(report=lambda line: spinner.update(line)))
    chosen_suite, outcome = asyncio.run(_run(settings, stack, suite, checkpoint))
    rows = [asdict(s) for s in outcome.scores]
    if as_json:
        print(json.dumps({"suite": chosen_suite.ref, "checkpoint": outcome.checkpoint, "scores": rows}))
        return
    table = Table(title=f"{chosen_suite.ref} on {outcome.checkpoint}")
    for column in ("environment", "score", "95% interval", "episodes", "failed"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["environment"],
            f"{row['score']:.3f}",
            f"{row['low']:.3f} – {row['high']:.3f}",
            str(row["episodes"]),
            str(row["failed"]),
        )
    out.print(table)


async def _run(
    settings: Settings, stack: Stack | None, source: str, checkpoint: str
) -> tuple[Suite, EvalOutcome]:
    from temporalio.client import WorkflowFailureError
    from temporalio.common import WorkflowIDConflictPolicy

    from rollout.evals.checkpoints import UnknownCheckpoint, resolve
    from rollout.ledger import Ledger
    from rollout.ledger.errors import LedgerError
    from rollout.workflows.client import failure_reason
    from rollout.workflows.evals import EvalWorkflow
    from rollout.workflows.names import RUNNER_QUEUE, eval_workflow_id

    try:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            suite = await suite_named(ledger, source)
            try:
                chosen = await resolve(ledger, checkpoint)
            except UnknownCheckpoint as error:
                fail(str(error))
            if chosen.needs_serving and not chosen.formats and stack is not None:
                # No engine can load it yet (an SFT adapter): the trainer worker bridges it first (a cluster's
                # trainer runs already).
                with err.status("trainer: starting (to make the checkpoint servable)"):
                    await asyncio.to_thread(guarded, lambda: stack.start_trainer(restart=False))
            client = await connect_temporal(settings)
            handle = await client.start_workflow(
                EvalWorkflow.run,
                eval_input(
                    suite,
                    checkpoint,
                    max_tokens=settings.run.max_tokens,
                    bridge_formats=["lora"] if settings.trainer.lora_rank else ["merged"],
                ),
                id=eval_workflow_id(suite.name, suite.version, checkpoint),
                task_queue=RUNNER_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,  # one already under way: wait for it
            )
            try:
                with err.status(f"{suite.ref} on {checkpoint}: playing…") as spinner:
                    waiting = asyncio.ensure_future(handle.result())
                    started = time.monotonic()
                    while not waiting.done():
                        done = await _episodes_done(ledger, suite, checkpoint)
                        spinner.update(
                            f"{suite.ref} on {checkpoint}: {done} episodes played "
                            f"({time.monotonic() - started:.0f} s)"
                        )
                        await asyncio.wait([waiting], timeout=1.0)
                    return suite, waiting.result()
            except WorkflowFailureError as error:
                fail(f"the eval of {suite.ref} on {checkpoint} failed: {failure_reason(error)}")
    except LedgerError as error:
        fail(f"{error}\nIs the stack up? `rollout up` starts it; `rollout status` shows it.")


async def _episodes_done(ledger: Ledger, suite: Suite, checkpoint: str) -> int:
    from rollout.evals.checkpoints import resolve
    from rollout.ledger import Kind
    from rollout.ledger.queries import count_events
    from rollout.ledger.streams import run_episodes_stream
    from rollout.workflows.names import eval_run

    name = (await resolve(ledger, checkpoint)).name
    total = 0
    for entry in suite.environments:
        stream = run_episodes_stream(eval_run(suite.name, suite.version, name, entry.name))
        total += await count_events(ledger, stream, Kind.EPISODE_FINISHED)
    return total


def _table_rows(results: list[EvalResult]) -> tuple[list[str], dict[tuple[str, str], dict[str, float]]]:
    """The environments (columns) and, per (suite@version, checkpoint) row, each environment's score."""
    environments: list[str] = []
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for result in results:
        if result.environment not in environments:
            environments.append(result.environment)
        cells.setdefault((f"{result.suite}@{result.version}", result.checkpoint), {})[result.environment] = (
            result.score
        )
    return sorted(environments), cells


@app.command("results")
def results(
    suite: Annotated[str | None, typer.Argument(help="NAME or NAME@VERSION (default: every suite).")] = None,
    overrides: Overrides = None,
    run: Annotated[str | None, typer.Option("--run", help="Only the checkpoints of this run.")] = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Recorded scores: one row per suite version and checkpoint, one column per environment."""
    from rollout.evals.records import results as read_results
    from rollout.ledger import Ledger

    settings = load_settings(cluster_overrides(cluster, overrides))
    name, _, version = (suite or "").partition("@")

    async def read() -> list[EvalResult]:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            return await read_results(ledger, name or None)

    found = [
        r
        for r in ledger_call(read())
        if (not version or r.version == version) and (run is None or (r.policy or "").startswith(f"{run}/"))
    ]
    if as_json:
        print(json.dumps([r.to_payload() for r in found]))
        return
    if not found:
        out.print("no eval results yet: `rollout eval run SUITE --checkpoint CHECKPOINT` records some")
        return
    environments, cells = _table_rows(found)
    table = Table(title="eval results (score per environment)")
    for column in ("suite", "checkpoint", *environments):
        table.add_column(column, overflow="fold")
    for (suite_ref, checkpoint), scores in cells.items():
        table.add_row(
            suite_ref,
            checkpoint,
            *(f"{scores[e]:.3f}" if e in scores else "" for e in environments),
        )
    out.print(table)


@app.command("compare")
def compare(
    suite: Annotated[str, typer.Argument(help="NAME or NAME@VERSION (default version: the newest).")],
    baseline: Annotated[
        str, typer.Argument(help="The checkpoint compared against (base, a name, latest:…).")
    ],
    candidate: Annotated[str, typer.Argument(help="The checkpoint that must not drop.")],
    overrides: Overrides = None,
    max_drop: Annotated[
        float, typer.Option("--max-drop", help="The largest drop of any environment's score allowed.", min=0)
    ] = 0.0,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Compare two checkpoints' recorded scores per environment; exit 1 when any environment's score drops by
    more than --max-drop (a CI gate). Both must have been scored on the same suite version."""
    from rollout.evals.checkpoints import UnknownCheckpoint, resolve
    from rollout.evals.records import UnknownSuite, find_suite
    from rollout.evals.records import results as read_results
    from rollout.evals.scoring import changes
    from rollout.ledger import Ledger

    settings = load_settings(cluster_overrides(cluster, overrides))
    name, _, version = suite.partition("@")

    async def read() -> tuple[str, str, str, list[EvalResult]]:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            try:
                chosen = await find_suite(ledger, name, version or None)
                a = (await resolve(ledger, baseline)).name
                b = (await resolve(ledger, candidate)).name
            except (UnknownSuite, UnknownCheckpoint) as error:
                fail(str(error))
            return chosen.version, a, b, await read_results(ledger, name)

    version, a, b, found = ledger_call(read())
    by_checkpoint: dict[str, dict[str, float]] = {a: {}, b: {}}
    for result in found:
        if result.version == version and result.checkpoint in by_checkpoint:
            by_checkpoint[result.checkpoint][result.environment] = result.score
    environments = sorted(by_checkpoint[a].keys() | by_checkpoint[b].keys())
    missing = [f"{c} × {e}" for c in (a, b) for e in environments if e not in by_checkpoint[c]]
    if not environments or missing:
        fail(
            f"{name}@{version} has no score for {', '.join(missing) or f'{a} or {b}'}: score both with "
            f"`rollout eval run {name}@{version} --checkpoint CHECKPOINT`"
        )
    compared = changes(by_checkpoint[a], by_checkpoint[b], max_drop)
    dropped = [c.environment for c in compared if c.regressed]
    if as_json:
        rows = [asdict(c) | {"change": c.change} for c in compared]
        print(
            json.dumps(
                {
                    "suite": f"{name}@{version}",
                    "baseline": a,
                    "candidate": b,
                    "rows": rows,
                    "dropped": dropped,
                }
            )
        )
    else:
        table = Table(title=f"{name}@{version}: {b} against {a}")
        for column in ("environment", "baseline", "candidate", "change"):
            table.add_column(column)
        for c in compared:
            shown = f"{c.change:+.3f}"
            table.add_row(
                c.environment,
                f"{c.baseline:.3f}",
                f"{c.candidate:.3f}",
                f"[red]{shown}[/]" if c.regressed else shown,
            )
        out.print(table)
    if dropped:
        err.print(
            f"[bold red]error:[/] {b} dropped more than {max_drop} against {a} on {', '.join(dropped)}",
            highlight=False,
        )
        raise typer.Exit(1)


def register(app_: typer.Typer) -> None:
    from rollout.cli import eval_schedules

    app.command("schedule")(eval_schedules.schedule)
    app.add_typer(eval_schedules.schedules, name="schedules")
    app_.add_typer(app, name="eval")
