"""Following a training run while it plays: a live line on a terminal, plain progress lines elsewhere (CI logs,
`tee`), and what to say when it pauses or ends.

Contract: `follow_training` returns when the run's workflow is no longer running (its final status), and exits
the command with the pause reason and how to resume when the run pauses itself (a non-finite loss). It reads
progress from the ledger only, so following can stop and start again at any time (`rollout run attach`).
A service that dies meanwhile (Postgres, Temporal: the supervisor restarts it) does not end the command: the
line says what it waits for, and following resumes when the service is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from temporalio.service import RPCError

from rollout.cli.common import err, fail
from rollout.cli.training_view import TrainingProgress
from rollout.ledger import Ledger
from rollout.ledger.errors import LedgerUnreachableError

if TYPE_CHECKING:
    from temporalio.client import WorkflowHandle

    from rollout.workflows.run import RunWorkflow
    from rollout.workflows.types import RunStatus

PLAIN_EVERY_S = 10.0  # without a terminal, a progress line at most this often (and whenever a step lands)


async def follow_training(
    ledger: Ledger, handle: WorkflowHandle[RunWorkflow, RunStatus], progress: TrainingProgress
) -> RunStatus:
    from rich.live import Live

    from rollout.workflows.run import RunWorkflow

    run = progress.run
    started = time.monotonic()

    outage: list[str] = []  # what the last tick could not reach, shown on the line until it answers again

    async def tick() -> bool:
        """Refresh; False once the run's workflow has ended."""
        try:
            await progress.refresh(ledger)
            description = await handle.describe()
            if description.status is not None and description.status.name != "RUNNING":
                return False
            status = await handle.query(RunWorkflow.status)
        except LedgerUnreachableError:
            outage[:] = ["waiting for Postgres to come back (the stack's supervisor restarts it)"]
            return True
        except RPCError as error:
            outage[:] = [
                f"waiting for Temporal to come back ({error.status.name.lower()}; the supervisor restarts it)"
            ]
            return True
        outage.clear()
        if status.pause_reason:
            fail(f"run {run} paused: {status.pause_reason}\nFix the cause, then `rollout run resume {run}`.")
        return True

    def line() -> str:
        return progress.line() + (f" · {outage[0]}" if outage else "")

    if err.is_terminal:
        with Live(console=err, refresh_per_second=2) as live:
            while await tick():
                live.update(f"[{time.monotonic() - started:5.0f}s] {line()}")
                await asyncio.sleep(1.0)
    else:
        last_line, last_at = "", 0.0
        while await tick():
            text, now = line(), time.monotonic()
            steps_changed = text.split(" · ")[0] != last_line.split(" · ")[0]
            if text != last_line and (steps_changed or now - last_at >= PLAIN_EVERY_S or outage):
                err.print(f"[{now - started:5.0f}s] {text}", highlight=False, markup=False)
                last_line, last_at = text, now
            await asyncio.sleep(1.0)
    final = await outlasting(handle.result)
    await outlasting(lambda: progress.refresh(ledger))
    return final


async def outlasting[T](call: Callable[[], Awaitable[T]], window_s: float = 600.0) -> T:
    """`call()`, repeated while Temporal or the ledger is away, for at most `window_s`."""
    deadline = time.monotonic() + window_s
    while True:
        try:
            return await call()
        except (LedgerUnreachableError, RPCError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


def print_summary(progress: TrainingProgress, status: RunStatus) -> dict[str, Any]:
    """The end-of-run summary: what trained, what was served, what was skipped and why."""
    from rollout.cli.common import out

    summary = progress.summary() | {"episodes_failed": status.episodes_failed}
    out.print(
        f"run {progress.run}: {summary['steps']} steps, {len(progress.served)} checkpoints served during the "
        f"run, {summary['episodes']} episodes; reward by step {summary['reward_by_step']}",
        highlight=False,
    )
    if reason := progress.skipped_reason():
        out.print(reason, highlight=False)
    return summary
