"""The `rollout` command: every command group, each from its own module, on one Typer app."""

from __future__ import annotations

import os
import sys

import typer

from rollout.cli import (
    checkpoint,
    cluster,
    common,
    config,
    engine,
    env,
    eval_schedules,
    gateway,
    ledger,
    models,
    monitor,
    preset,
    run,
    sandbox,
    seat,
    sft,
    stack,
    train,
    worker,
)
from rollout.control.errors import ControlError
from rollout.control.waits import stray_paragraph
from rollout.security.redaction import scrub_process_output

app = typer.Typer(
    name="rollout",
    help="rollout: reinforcement learning for language-model agents. `rollout train ENV` trains on the embedded "
    "stack; `rollout up` starts the stack alone.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stack.register(app)
train.register(app)
monitor.register(app)
app.command()(sft.sft)
gateway.register(app)
app.add_typer(run.app, name="run")
app.add_typer(checkpoint.app, name="checkpoint")
app.add_typer(env.app, name="env")
eval_schedules.register(app)
app.add_typer(seat.app, name="seat")
app.add_typer(engine.app, name="engine")
app.add_typer(worker.app, name="worker")
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(config.app, name="config")
app.add_typer(ledger.app, name="ledger")
app.add_typer(models.app, name="models")
app.add_typer(preset.app, name="preset")
app.add_typer(cluster.app, name="cluster")


def main() -> None:
    """Run the command, then leave without interpreter finalization: a Temporal client's Rust threads can
    crash CPython as it finalizes (SIGSEGV after a command that already did its work and printed its result;
    temporalio/sdk-python issue 300). Output is flushed first; the exit status is the command's. Everything a
    command writes is scrubbed of secrets (rollout.security.redaction) but the seat key `rollout seat new`
    exists to print. A `ControlError` from the application layer is its one paragraph, never a traceback; so
    is a Temporal error that no wait caught (`rollout.control.waits.stray_paragraph`)."""
    scrub_process_output()
    try:
        app(prog_name="rollout")
        code = 0
    except ControlError as error:
        common.err.print(f"[bold red]error:[/] {error}", highlight=False)
        code = 2 if error.usage else 1
    except Exception as error:
        said = stray_paragraph(error)
        if said is None:
            raise
        common.err.print(f"[bold red]error:[/] {said}", highlight=False)
        code = 1
    except SystemExit as done:
        if isinstance(done.code, int) or done.code is None:
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
            code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
