"""Following a training run while it plays: a live line on a terminal, plain progress lines elsewhere (CI
logs, `tee`), and what to say when it pauses or ends.

Contract: `follow_training` returns when the run's workflow is no longer running (its final status), and exits
the command with the pause reason and how to resume when the run pauses itself (a non-finite loss). It reads
progress from the ledger only, so following can stop and start again at any time (`rollout run attach`).
A service that dies meanwhile (Postgres, Temporal: the supervisor restarts it) does not end the command: the
line says what it waits for, and following resumes when the service is back. A stack stopped on purpose (its
supervisor gone: nothing will bring the service back) ends it, saying how to continue. A tracking backend that
refuses the run's records (rollout.control.tracking) shows on the line, with the setting to look at, until it
takes them again (training goes on meanwhile), and after the summary when it still refused as the run ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import typer
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

from rollout.cli.common import err, fail, out
from rollout.control.connections import outlasting
from rollout.control.progress import TrainingProgress, run_line
from rollout.control.waits import READ_TIMEOUT
from rollout.failures import one_line
from rollout.ledger import Ledger
from rollout.ledger.errors import LedgerUnreachableError

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle

    from rollout.config import Settings
    from rollout.workflows.run import RunWorkflow
    from rollout.workflows.run_types import RunStatus

TRACKING_SETTLE_S = 20.0  # as a run ends: how long to wait for its feed's first report
TRACKING_EVERY_S = 5.0  # how often the line asks how the run's tracking backends stand
PLAIN_EVERY_S = 10.0  # without a terminal, a progress line at most this often (and whenever a step lands)


async def follow_training(
    ledger: Ledger,
    handle: WorkflowHandle[RunWorkflow, RunStatus],
    progresses: Sequence[TrainingProgress],
    stack_stopped: Callable[[], bool] = lambda: False,
    client: Client | None = None,
) -> RunStatus:
    from rich.live import Live

    from rollout.control.tracking import tracking_line, tracking_state
    from rollout.workflows.run import RunWorkflow

    run = progresses[0].run
    started = time.monotonic()

    outage: list[str] = []  # what the last tick could not reach, shown on the line until it answers again
    refusing: list[str] = []  # a tracking backend that refuses, shown until it takes the run's records again
    tracking_read = [0.0]

    async def tick() -> bool:
        """Refresh; False once the run's workflow has ended."""
        try:
            for progress in progresses:
                await progress.refresh(ledger)
            # Bounded reads: a Temporal that stopped answering shows on the line within seconds.
            description = await handle.describe(rpc_timeout=READ_TIMEOUT)
            if description.status is not None and description.status.name != "RUNNING":
                return False
            status = await handle.query(RunWorkflow.status, rpc_timeout=READ_TIMEOUT)
        except (LedgerUnreachableError, RPCError) as error:
            if stack_stopped():
                fail(
                    f"the stack was stopped (`rollout down`), so run {run} does not play now; it is kept as it "
                    f"was. Start the stack with `rollout up`, then `rollout run attach {run}` (it brings the stack "
                    "to the run's model and settings, resumes the run and follows it)."
                )
            if isinstance(error, LedgerUnreachableError):
                outage[:] = ["waiting for Postgres to come back (the stack's supervisor restarts it)"]
            else:
                outage[:] = [
                    f"waiting for Temporal to answer ({error.status.name.lower()}; the supervisor restarts it if it died)"
                ]
            return True
        outage.clear()
        if client is not None and time.monotonic() - tracking_read[0] >= TRACKING_EVERY_S:
            tracking_read[0] = time.monotonic()
            state = await tracking_state(client, run)
            failing = state is not None and not all(b.ok for b in state.backends)
            refusing[:] = [tracking_line(state)] if state is not None and failing else []
        if status.pause_reason:
            fail(f"run {run} paused: {status.pause_reason}\nFix the cause, then `rollout run resume {run}`.")
        return True

    def line() -> str:
        return run_line(progresses) + "".join(f" · {said}" for said in (*outage, *refusing))

    if err.is_terminal:
        with Live(console=err, refresh_per_second=2) as live:
            while await tick():
                live.update(f"[{time.monotonic() - started:5.0f}s] {line()}")
                await asyncio.sleep(1.0)
    last_line, last_at = "", 0.0
    if not err.is_terminal:
        while await tick():
            text, now = line(), time.monotonic()
            steps_changed = text.split(" · ")[0] != last_line.split(" · ")[0]
            # A tracking backend newly refusing, or a new reason episodes fail: said at once, not at the next
            # step (the run may end first).
            said_anew = any(said not in last_line for said in refusing) or _why_failing(text) != _why_failing(
                last_line
            )
            if text != last_line and (steps_changed or now - last_at >= PLAIN_EVERY_S or outage or said_anew):
                err.print(f"[{now - started:5.0f}s] {text}", highlight=False, markup=False)
                last_line, last_at = text, now
            await asyncio.sleep(1.0)
    final = await outlasting(handle.result)
    for progress in progresses:
        await outlasting(lambda progress=progress: progress.refresh(ledger))
    if not err.is_terminal and (text := line()) != last_line:  # where it ended, what the last tick missed
        err.print(f"[{time.monotonic() - started:5.0f}s] {text}", highlight=False, markup=False)
    return final


def print_summary(progress: TrainingProgress, status: RunStatus, *, named: bool = False) -> dict[str, Any]:
    """The end-of-run summary: what trained, what was served, what was skipped and why (`named`: for which
    policy, one of several)."""
    summary = progress.summary() | {"episodes_failed": status.episodes_failed}
    which = f", policy {progress.policy}" if named else ""
    out.print(
        f"run {progress.run}{which}: {summary['steps']} steps, {len(progress.served)} checkpoints served during the "
        f"run, {summary['episodes']} episodes; reward by step {summary['reward_by_step']}",
        highlight=False,
    )
    if learned := progress.learned():
        out.print(learned, highlight=False)
    if reason := progress.skipped_reason():
        out.print(reason, highlight=False)
    for said in progress.failures_said():
        out.print(said, highlight=False)
    return summary


def follow_to_the_end(
    settings: Settings, run: str, policies: Sequence[str], *, as_json: bool, embedded: bool
) -> None:
    """Show run `run` live until it ends (each of its trained `policies`), then its summary; Ctrl-C pauses it
    and says how to come back. With `embedded`, a stack stopped on purpose (`rollout down`) ends the command,
    saying how to continue."""
    import contextlib
    import json
    import logging

    from rollout.control.connections import connect_temporal
    from rollout.control.errors import ControlError
    from rollout.control.evals import run_eval_scores
    from rollout.control.runs import update_run
    from rollout.control.tracking import settled_tracking, tracking_line
    from rollout.stack.embedded import Stack
    from rollout.workflows.client import run_handle
    from rollout.workflows.run_types import PauseRun

    progresses = [TrainingProgress(run, policy) for policy in policies]
    stack = Stack(settings) if embedded else None

    def stopped() -> bool:
        return stack is not None and not stack.supervised()

    # The pool's own warnings about a lost server would break the progress line, which says it better.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

    refused: list[str] = []  # a tracking backend that refused the run, said with the summary

    async def follow() -> RunStatus:
        client = await connect_temporal(settings)
        handle = run_handle(client, run)
        # A short reconnect window: the live line says what it waits for instead of hanging in a ledger call.
        ledger = await outlasting(lambda: Ledger.connect(settings.ledger_url, reconnect_window_s=3))
        async with ledger:
            status = await follow_training(ledger, handle, progresses, stopped, client)
        if settings.tracking.backends:
            state = await settled_tracking(client, run, TRACKING_SETTLE_S)
            if state is not None and not all(b.ok for b in state.backends):
                refused.append(tracking_line(state))
        return status

    followed_at = time.monotonic()
    try:
        status = asyncio.run(follow())
    except WorkflowFailureError as error:
        cause = error.cause if error.cause is not None else error
        fail(
            f"run {run} failed: {one_line(str(cause))}. What it played and trained stays in the ledger: "
            f"`rollout run status {run}` shows it; the stack keeps running."
        )
    except KeyboardInterrupt:
        asyncio.run(update_run(settings, run, PauseRun()))
        err.print(
            f"\npaused run {run}. Come back to it with `rollout run attach {run}` (it resumes the run and restarts "
            "its trainer); the stack keeps running."
        )
        raise typer.Exit(130) from None
    evals: list[dict[str, object]] = []
    if settings.eval.suite is not None:
        # A ledger that cannot be read now: the summary goes without them.
        with contextlib.suppress(ControlError):
            evals = asyncio.run(run_eval_scores(settings, run))
    if as_json:
        summary = progresses[0].summary() | {
            "episodes_failed": status.episodes_failed,
            "evals": evals,
            "run_s": round(time.monotonic() - followed_at, 1),  # the run itself: the stack's start excluded
            "tracking_refused": refused,
        }
        if len(progresses) > 1:
            summary["policies"] = [progress.summary() for progress in progresses]
        print(json.dumps(summary))
        return
    for progress in progresses:
        print_summary(progress, status, named=len(progresses) > 1)
    for said in refused:
        err.print(said, highlight=False, markup=False)
    for scored in evals:
        scores = scored["scores"]
        assert isinstance(scores, dict)
        shown = ", ".join(f"{e} {v:.3f}" for e, v in scores.items())
        out.print(f"eval {scored['suite']} of {scored['checkpoint']}: {shown}", highlight=False)


def _why_failing(line: str) -> str:
    """The reason a progress line gives for failing episodes (without their count), or ""."""
    return next((part.partition("failed: ")[2] for part in line.split(" · ") if "failed: " in part), "")
