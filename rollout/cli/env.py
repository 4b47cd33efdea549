"""`rollout env check`: does an environment load, declare valid tools and play to a reward? Needs no
services."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from rollout.cli.common import JsonFlag, Overrides, err, load_settings, out

app = typer.Typer(help="Environments: check one before a run plays it.", no_args_is_help=True)


@app.command("check")
def check(
    reference: Annotated[str, typer.Argument(help="The environment, as package.module:attribute.")],
    overrides: Overrides = None,
    tasks: Annotated[int, typer.Option(min=1, help="How many of its tasks to play (groups 0, 1, …).")] = 1,
    as_json: JsonFlag = False,
) -> None:
    """Import an environment, check its tools, and play one episode per agent against a scripted model.

    Exits non-zero, naming what is wrong and where, when anything fails. Each call into the environment is
    bounded as in a run (Environment.turn_timeout_s, episode_timeout_s). Needs no services.
    """
    import logging
    from dataclasses import asdict

    from rich.table import Table

    from rollout.control.env_check import check_environment

    # A sandbox kind says what it sets up (the minecraft kind's first install takes a while): show it.
    setting_up = logging.getLogger("rollout.sandbox")
    setting_up.setLevel(logging.INFO)
    if not setting_up.handlers:
        setting_up.addHandler(logging.StreamHandler())
    settings = load_settings(overrides)  # sandbox.isolation=none checks it unjailed
    with err.status(f"checking {reference}…") as spinner:
        report = asyncio.run(
            check_environment(
                reference,
                isolation=settings.sandbox.isolation,
                tasks=tasks,
                progress=lambda line: spinner.update(line),
            )
        )
    if as_json:
        print(json.dumps({"ok": report.ok, **asdict(report)}))
    else:
        table = Table("agent", "turns", "reward", "tools", title=f"{reference} ({report.environment or '?'})")
        for played in report.plays:
            reward = (
                "—"
                if played.reward is None
                else f"{played.reward:g}" + (" (truncated)" if played.truncated else "")
            )
            table.add_row(played.agent, str(played.turns), reward, ", ".join(played.tools) or "—")
        if report.plays:
            out.print(table)
        for finding in report.findings:
            err.print(
                f"[bold red]✗[/] {finding.where}: {finding.problem}",
                highlight=False,
                emoji=False,
                markup=True,
            )
        if report.ok:
            out.print(
                "[bold green]✓[/] the environment loads, its tools are valid and every agent played to a reward"
            )
    if not report.ok:
        raise typer.Exit(1)
