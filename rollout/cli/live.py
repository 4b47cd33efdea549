"""Following a training run while it plays: a live line on a terminal, plain progress lines elsewhere (CI
logs, `tee`), and what to say when it pauses or ends.

Contract: `follow_to_the_end` returns once the run's workflow is no longer running (after its summary), and
exits the command with the pause reason and how to resume when the run pauses itself (a non-finite loss). What
it shows comes from rollout.control.following (the ledger's numbers, the run's state, what holds following up:
a service the supervisor brings back, a tracking backend that refuses the run's records, with the setting to
look at); a stack stopped on purpose (`rollout down`) ends it, saying how to continue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from rollout.cli.common import err, fail, out

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.control.following import Following, Tick
    from rollout.control.progress import TrainingProgress
    from rollout.run.settings import RunStatus

PLAIN_EVERY_S = 10.0  # without a terminal, a progress line at most this often (and whenever a step lands)


async def show_until_it_ends(following: Following) -> RunStatus:
    """Draw the run's line until its workflow ends (live on a terminal, lines elsewhere); its final state."""
    from rich.live import Live

    run, started = following.run, time.monotonic()

    async def tick() -> Tick:
        now = await following.tick()
        if now.stack_stopped:
            fail(
                f"the stack was stopped (`rollout down`), so run {run} does not play now; it is kept as it "
                f"was. Start the stack with `rollout up`, then `rollout run attach {run}` (it brings the stack "
                "to the run's model and settings, resumes the run and follows it)."
            )
        if now.status is not None and now.status.pause_reason:
            fail(
                f"run {run} paused: {now.status.pause_reason}\nFix the cause, then `rollout run resume {run}`."
            )
        return now

    if err.is_terminal:
        with Live(console=err, refresh_per_second=2) as live:
            while (await tick()).playing:
                live.update(f"[{time.monotonic() - started:5.0f}s] {following.line()}")
                await asyncio.sleep(1.0)
    last_line, last_at = "", 0.0
    if not err.is_terminal:
        while (now := await tick()).playing:
            text, at = following.line(), time.monotonic()
            steps_changed = text.split(" · ")[0] != last_line.split(" · ")[0]
            # A tracking backend newly refusing, or a new reason episodes fail: said at once, not at the next
            # step (the run may end first).
            said_anew = any(said not in last_line for said in now.refusing) or _why_failing(
                text
            ) != _why_failing(last_line)
            if text != last_line and (
                steps_changed or at - last_at >= PLAIN_EVERY_S or now.outage or said_anew
            ):
                err.print(f"[{at - started:5.0f}s] {text}", highlight=False, markup=False)
                last_line, last_at = text, at
            await asyncio.sleep(1.0)
    final = await following.finish()
    if (
        not err.is_terminal and (text := following.line()) != last_line
    ):  # where it ended, what the last tick missed
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

    from rollout.control.errors import ControlError
    from rollout.control.evals import run_eval_scores
    from rollout.control.following import Following, RunFailed
    from rollout.control.runs import update_run
    from rollout.run.settings import PauseRun
    from rollout.stack.embedded import Stack

    stack = Stack(settings) if embedded else None

    def stopped() -> bool:
        return stack is not None and not stack.supervised()

    # The pool's own warnings about a lost server would break the progress line, which says it better.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

    following = Following(settings, run, policies, stopped)
    refused: list[str] = []  # a tracking backend that refused the run, said with the summary

    async def follow() -> RunStatus:
        async with following:
            status = await show_until_it_ends(following)
            if (said := await following.tracking_refused()) is not None:
                refused.append(said)
        return status

    followed_at = time.monotonic()
    try:
        status = asyncio.run(follow())
    except RunFailed as error:
        fail(str(error))
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
        summary = following.progresses[0].summary() | {
            "episodes_failed": status.episodes_failed,
            "evals": evals,
            "run_s": round(time.monotonic() - followed_at, 1),  # the run itself: the stack's start excluded
            "tracking_refused": refused,
        }
        if len(following.progresses) > 1:
            summary["policies"] = [progress.summary() for progress in following.progresses]
        print(json.dumps(summary))
        return
    for progress in following.progresses:
        print_summary(progress, status, named=len(following.progresses) > 1)
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
