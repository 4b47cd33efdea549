"""`rollout eval register|run|results|compare`: versioned suites scored on checkpoints (rollout.control.evals
does the work; `rollout eval schedule|schedules` are rollout.cli.eval_schedules').

A suite is named `NAME` (its newest registered version), `NAME@VERSION`, a YAML or Python file, or a shipped
suite (`smoke`); files and shipped suites are registered on first use. Scores live in the ledger (one
`EvalResult` per suite version, checkpoint and environment); the runs are `EvalWorkflow`s on the runners.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from rollout.cli.cluster import ClusterFlag, cluster_overrides
from rollout.cli.common import JsonFlag, Overrides, err, load_settings, out, progress

if TYPE_CHECKING:
    from rollout.evals import EvalResult

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


@app.command("register")
def register_(
    file: Annotated[str, typer.Argument(help="A suite file (.yaml or .py), or package.module:attribute.")],
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Record a suite version in the ledger under NAME@VERSION with its content hash. Registering the same
    content again changes nothing; other content under a registered version is refused: bump the version."""
    from rollout.control.evals import register_suite

    settings = load_settings(cluster_overrides(cluster, overrides))
    suite, new = asyncio.run(register_suite(settings, file))
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
    """Score SUITE on one checkpoint and print a score per environment (with its 95% interval). Starts what is
    missing of the embedded stack (with --cluster, the cluster's runners play it and nothing starts here). A
    suite version already scored on that checkpoint is not played again: its recorded scores are shown."""
    from rollout.control.connections import stack_action
    from rollout.control.evals import run_eval
    from rollout.stack.embedded import Stack

    settings = load_settings(cluster_overrides(cluster, overrides))
    stack = None if cluster else Stack(settings)
    if stack is not None:
        with err.status("starting the stack…") as spinner:
            stack_action(lambda: stack.up(report=lambda line: spinner.update(line)))
    with progress(f"{suite} on {checkpoint}: playing…") as report:
        chosen_suite, outcome = asyncio.run(run_eval(settings, stack, suite, checkpoint, report=report))
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
    from rollout.control.evals import read_results

    settings = load_settings(cluster_overrides(cluster, overrides))
    found = asyncio.run(read_results(settings, suite, run))
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
    from rollout.control.evals import compare as compare_checkpoints

    settings = load_settings(cluster_overrides(cluster, overrides))
    compared = asyncio.run(compare_checkpoints(settings, suite, baseline, candidate, max_drop))
    a, b = compared.baseline, compared.candidate
    if as_json:
        rows = [asdict(c) | {"change": c.change} for c in compared.changes]
        print(
            json.dumps(
                {
                    "suite": compared.suite,
                    "baseline": a,
                    "candidate": b,
                    "rows": rows,
                    "dropped": compared.dropped,
                }
            )
        )
    else:
        table = Table(title=f"{compared.suite}: {b} against {a}")
        for column in ("environment", "baseline", "candidate", "change"):
            table.add_column(column)
        for c in compared.changes:
            shown = f"{c.change:+.3f}"
            table.add_row(
                c.environment,
                f"{c.baseline:.3f}",
                f"{c.candidate:.3f}",
                f"[red]{shown}[/]" if c.regressed else shown,
            )
        out.print(table)
    if compared.dropped:
        err.print(
            f"[bold red]error:[/] {b} dropped more than {max_drop} against {a} on {', '.join(compared.dropped)}",
            highlight=False,
        )
        raise typer.Exit(1)
