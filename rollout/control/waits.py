"""Waits on Temporal that ride out its bad moments: a call repeated while Temporal is away or slow, saying
what it waits for, and one paragraph when it stays away.

Contract:
- `transient(error)`: whether Temporal's `RPCError` says it is away or behind for now (unavailable, a deadline
  exceeded on either side, overloaded, a cancelled call or a broken connection: an http2 or transport error;
  a namespace not found while the server restarts), not an answer (not found, refused, invalid), which a
  retry would only repeat.
- `patiently(call, waiting_for, settings, ...)` returns `call()`'s value. While `call` fails transiently it is
  called again (after 1 s, backing off to `MAX_PAUSE_S`) for at most `window_s`; `report` hears, once per
  retry, what is awaited and why (`waiting for Temporal (the eval's result): unavailable; trying again`), and
  `report("")` once it answers again. Any other error is raised as it is. Trouble that outlasts `window_s` is
  `TemporalAway`: one paragraph naming Temporal's address, its log file, what was awaited and what to do.
- `call` must be safe to repeat: a workflow's result, a query, an update with a fixed id, a start that joins
  the workflow already under way.
- `stray_paragraph(error)`: the one paragraph the command line prints for a Temporal error no wait caught.
- `workflow_result(handle, waiting_for, settings, ...)`: the result of a workflow someone waits on at a
  prompt. Its state is read every `POLL_S`, each read given `READ_TIMEOUT` (a long poll would hide a Temporal
  that stopped answering for its whole 20 s interval), each through `patiently`; once it has closed, its
  result.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.control.errors import Unreachable

if TYPE_CHECKING:
    from temporalio.client import WorkflowHandle

    from rollout.config import Settings

READ_TIMEOUT = timedelta(seconds=5)  # a read Temporal answers in milliseconds when it is well
RESULT_RPC_TIMEOUT = timedelta(seconds=30)  # a result's long poll, which a healthy server answers within 20 s
POLL_S = 1.0
WINDOW_S = 600.0  # the supervisor restarts a dead Temporal within seconds; ten minutes away is not a blip
OUTAGE_S = 120.0  # a start or an update that someone is waiting on at a prompt
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 5.0

# Words of a broken or timed-out call in the messages of statuses that also carry real answers.
_TRANSPORT_WORDS = (
    "http2",
    "transport",
    "connection",
    "timeout",
    "timed out",
    "deadline",
    "broken pipe",
    "reset",
)


class TemporalAway(Unreachable):
    """Temporal did not answer for the whole window of a wait."""


def transient(error: BaseException) -> bool:
    from temporalio.service import RPCError, RPCStatusCode

    if not isinstance(error, RPCError):
        return False
    if error.status in (
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.ABORTED,
        RPCStatusCode.CANCELLED,
    ):
        return True
    if error.status in (RPCStatusCode.UNKNOWN, RPCStatusCode.INTERNAL):
        return any(word in error.message.lower() for word in _TRANSPORT_WORDS)
    # A dev server restarting from its file answers for a moment before its namespace is loaded again.
    return error.status == RPCStatusCode.NOT_FOUND and "namespace" in error.message.lower()


def temporal_log(settings: Settings) -> str:
    """Where Temporal's log is: the embedded dev server's file, or its own server's log."""
    if settings.services.temporal.address:
        return f"the log of the Temporal server at {settings.temporal_address}"
    return str(Path(settings.data_dir).expanduser() / "logs" / "temporal.log")


def away_paragraph(settings: Settings, waiting_for: str, error: BaseException, then: str) -> str:
    from temporalio.service import RPCError

    said = f"{error.status.name.lower()}: {error.message}" if isinstance(error, RPCError) else str(error)
    return (
        f"Temporal at {settings.temporal_address} did not answer while waiting for {waiting_for} ({said}). "
        f"Its log is {temporal_log(settings)}; `rollout status` shows whether it runs (the embedded stack's "
        f"supervisor restarts it when it dies). {then}"
    ).strip()


def stray_paragraph(error: BaseException) -> str | None:
    """The paragraph for a service's error that no call of a command made a `ControlError` (None for any
    other error): a Temporal error (what Temporal said, where its log is, what to do), or a ledger error
    (what it said, and how to start the stack)."""
    if "rollout.ledger.errors" in sys.modules:  # else no ledger was ever opened: it is not the ledger's
        from rollout.control.errors import STACK_HINT
        from rollout.ledger.errors import LedgerError

        if isinstance(error, LedgerError):
            return f"{error}\n{STACK_HINT}"
    if "temporalio.service" not in sys.modules:  # no Temporal call was ever made: it is not Temporal's
        return None
    from temporalio.service import RPCError

    if not isinstance(error, RPCError):
        return None
    return (
        f"Temporal did not answer ({error.status.name.lower()}: {error.message}). The embedded stack's Temporal "
        "logs to logs/temporal.log in its data directory (`rollout config show` prints data_dir); `rollout "
        "status` shows whether it runs. What was recorded is kept: run the command again once Temporal answers."
    )


async def patiently[T](
    call: Callable[[], Awaitable[T]],
    waiting_for: str,
    settings: Settings,
    *,
    report: Callable[[str], None] = lambda line: None,
    then: str = "Nothing recorded is lost: run the same command again once Temporal answers.",
    window_s: float = WINDOW_S,
) -> T:
    deadline = time.monotonic() + window_s
    pause = FIRST_PAUSE_S
    troubled = False
    while True:
        try:
            answer = await call()
        except Exception as error:
            if not transient(error):
                raise
            if time.monotonic() + pause > deadline:
                raise TemporalAway(away_paragraph(settings, waiting_for, error, then)) from None
            report(f"waiting for Temporal ({waiting_for}): {_said(error)}; trying again")
            troubled = True
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        if troubled:
            report("")
        return answer


async def workflow_result[T](
    handle: WorkflowHandle[Any, T],
    waiting_for: str,
    settings: Settings,
    *,
    report: Callable[[str], None] = lambda line: None,
    then: str = "Nothing recorded is lost: run the same command again once Temporal answers.",
    window_s: float = WINDOW_S,
) -> T:
    from temporalio.client import WorkflowExecutionStatus

    while True:
        described = await patiently(
            lambda: handle.describe(rpc_timeout=READ_TIMEOUT),
            waiting_for,
            settings,
            report=report,
            then=then,
            window_s=window_s,
        )
        if described.status != WorkflowExecutionStatus.RUNNING:
            break
        await asyncio.sleep(POLL_S)
    return await patiently(
        lambda: handle.result(rpc_timeout=RESULT_RPC_TIMEOUT),
        waiting_for,
        settings,
        report=report,
        then=then,
        window_s=window_s,
    )


def _said(error: BaseException) -> str:
    from temporalio.service import RPCError

    if isinstance(error, RPCError):
        return error.status.name.lower().replace("_", " ")
    return type(error).__name__
