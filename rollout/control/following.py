"""Following a training run while it plays, as calls: what `rollout train` and `rollout run attach` show live.

Contract:
- `Following` reads the run's progress from the ledger only (rollout.control.progress), so following can stop
  and start again at any time; the run's workflow adds whether it still plays and its state.
- `tick()` refreshes and says how things stand (`Tick`): whether the run still plays, its `RunStatus`, and
  what holds following up. A service that died meanwhile (Postgres, Temporal: the supervisor restarts it) is
  an `outage` line, not an error, and following resumes when the service is back; a stack stopped on purpose
  (`stack_stopped()`: its supervisor gone, nothing will bring the service back) is said by `stack_stopped` on
  the tick. A tracking backend that refuses the run's records (rollout.control.tracking) is a `refusing` line
  until it takes them again, asked at most every `TRACKING_EVERY_S`.
- `finish()` waits out the run's end and reads its last progress: its final `RunStatus`, or `RunFailed` with
  the workflow's cause in one line. `tracking_refused()` is what a backend still refused as the run ended
  (waiting up to `TRACKING_SETTLE_S` for the feed's first report), or None.
- Nothing here prints; the CLI (rollout.cli.live) draws the line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Self

from rollout.control.connections import connect_temporal, outlasting
from rollout.control.errors import ControlError
from rollout.control.progress import TrainingProgress, run_line
from rollout.control.waits import READ_TIMEOUT
from rollout.run.failures import one_line

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle

    from rollout.config import Settings
    from rollout.ledger import Ledger
    from rollout.run.settings import RunStatus
    from rollout.workflows.run import RunWorkflow

TRACKING_SETTLE_S = 20.0  # as a run ends: how long to wait for its feed's first report
TRACKING_EVERY_S = 5.0  # how often a tick asks how the run's tracking backends stand


class RunFailed(ControlError):
    """The run's workflow failed; what it played and trained stays in the ledger."""


@dataclass
class Tick:
    """How a followed run stands after one refresh."""

    playing: bool  # False once the run's workflow has ended
    status: RunStatus | None = None  # its state, when its workflow answered
    outage: str | None = None  # what could not be reached this time, and what brings it back
    stack_stopped: bool = False  # the stack was stopped on purpose while a service did not answer
    refusing: list[str] = field(default_factory=list[str])  # a tracking backend that refuses, in a line


class Following:
    """A training run followed from the ledger and its workflow (`async with`: the connections it holds)."""

    def __init__(
        self,
        settings: Settings,
        run: str,
        policies: Sequence[str],
        stack_stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self.settings, self.run = settings, run
        self.progresses = [TrainingProgress(run, policy) for policy in policies]
        self._stack_stopped = stack_stopped
        self._refusing: list[str] = []
        self._outage: list[str] = []
        self._tracking_read = 0.0
        self._client: Client | None = None
        self._ledger: Ledger | None = None
        self._handle: WorkflowHandle[RunWorkflow, RunStatus] | None = None

    async def __aenter__(self) -> Self:
        from rollout.ledger import Ledger
        from rollout.workflows.client import run_handle

        self._client = await connect_temporal(self.settings)
        self._handle = run_handle(self._client, self.run)
        # A short reconnect window: the line says what it waits for instead of hanging in a ledger call.
        self._ledger = await outlasting(
            lambda: Ledger.connect(self.settings.ledger_url, reconnect_window_s=3)
        )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._ledger is not None:
            await self._ledger.close()

    def line(self) -> str:
        """Each policy's progress in one line, with what holds following up and what a backend refuses."""
        return run_line(self.progresses) + "".join(f" · {said}" for said in (*self._outage, *self._refusing))

    async def tick(self) -> Tick:
        from temporalio.service import RPCError

        from rollout.control.tracking import tracking_line, tracking_state
        from rollout.ledger.errors import LedgerUnreachableError
        from rollout.workflows.run import RunWorkflow

        assert self._handle is not None and self._ledger is not None and self._client is not None
        try:
            for progress in self.progresses:
                await progress.refresh(self._ledger)
            # Bounded reads: a Temporal that stopped answering shows on the line within seconds.
            description = await self._handle.describe(rpc_timeout=READ_TIMEOUT)
            if description.status is not None and description.status.name != "RUNNING":
                return Tick(playing=False)
            status = await self._handle.query(RunWorkflow.status, rpc_timeout=READ_TIMEOUT)
        except (LedgerUnreachableError, RPCError) as error:
            if isinstance(error, LedgerUnreachableError):
                said = "waiting for Postgres to come back (the stack's supervisor restarts it)"
            else:
                said = (
                    f"waiting for Temporal to answer ({error.status.name.lower()}; the supervisor restarts it if "
                    "it died)"
                )
            self._outage[:] = [said]
            return Tick(
                playing=True, outage=said, stack_stopped=self._stack_stopped(), refusing=self._refusing
            )
        self._outage.clear()
        if time.monotonic() - self._tracking_read >= TRACKING_EVERY_S:
            self._tracking_read = time.monotonic()
            state = await tracking_state(self._client, self.run)
            failing = state is not None and not all(b.ok for b in state.backends)
            self._refusing[:] = [tracking_line(state)] if state is not None and failing else []
        return Tick(playing=True, status=status, refusing=self._refusing)

    async def finish(self) -> RunStatus:
        from temporalio.client import WorkflowFailureError

        assert self._handle is not None and self._ledger is not None
        try:
            final = await outlasting(self._handle.result)
        except WorkflowFailureError as error:
            cause = error.cause if error.cause is not None else error
            raise RunFailed(
                f"run {self.run} failed: {one_line(str(cause))}. What it played and trained stays in the ledger: "
                f"`rollout run status {self.run}` shows it; the stack keeps running."
            ) from None
        ledger = self._ledger
        for progress in self.progresses:
            await outlasting(lambda progress=progress: progress.refresh(ledger))
        return final

    async def tracking_refused(self) -> str | None:
        from rollout.control.tracking import settled_tracking, tracking_line

        if not self.settings.tracking.backends:
            return None
        assert self._client is not None
        state = await settled_tracking(self._client, self.run, TRACKING_SETTLE_S)
        if state is not None and not all(b.ok for b in state.backends):
            return tracking_line(state)
        return None
