"""Following a training run while it plays: a live line on a terminal, plain progress lines elsewhere (CI logs,
`tee`), and what to say when it pauses or ends.

Contract: `follow_training` returns when the run's workflow is no longer running (its final status), and exits
the command with the pause reason and how to resume when the run pauses itself (a non-finite loss). It reads
progress from the ledger only, so following can stop and start again at any time (`rollout run attach`).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from rollout.cli.common import err, fail
from rollout.cli.training_view import TrainingProgress
from rollout.ledger import Ledger

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

    async def tick() -> bool:
        """Refresh; False once the run's workflow has ended."""
        await progress.refresh(ledger)
        description = await handle.describe()
        if description.status is not None and description.status.name != "RUNNING":
            return False
        status = await handle.query(RunWorkflow.status)
        if status.pause_reason:
            fail(f"run {run} paused: {status.pause_reason}\nFix the cause, then `rollout run resume {run}`.")
        return True

    if err.is_terminal:
        with Live(console=err, refresh_per_second=2) as live:
            while await tick():
                live.update(f"[{time.monotonic() - started:5.0f}s] {progress.line()}")
                await asyncio.sleep(1.0)
    else:
        last_line, last_at = "", 0.0
        while await tick():
            line, now = progress.line(), time.monotonic()
            steps_changed = line.split(" · ")[0] != last_line.split(" · ")[0]
            if line != last_line and (steps_changed or now - last_at >= PLAIN_EVERY_S):
                err.print(f"[{now - started:5.0f}s] {line}", highlight=False, markup=False)
                last_line, last_at = line, now
            await asyncio.sleep(1.0)
    final = await handle.result()
    await progress.refresh(ledger)
    return final


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
