"""The runner's `feed_tracking` activity: a run's records, from the ledger to its W&B and MLflow runs and its
traces to an OTLP collector.

Contract (the stub's docstring in rollout.workflows.runner_stubs is the activity's contract):
- It polls the ledger every `poll_s` for the run's entries (rollout.tracking.entries' `RunReader`: the steps
  only once the run's batch and checkpoint counts moved, each sample table built once) and pushes them to each
  backend (rollout.tracking.feed); with an OTLP endpoint, also the trace entries past what that backend
  holds (rollout.tracking.traces' `TraceReader`). A task heartbeats the feed's `TrackingState` every
  `poll_s` the whole time (ledger reads and slow backends included), so a live runner is never taken for
  dead.
- It returns once the run's workflow has closed (completed, failed, stopped, terminated: asked through the
  activity's own Temporal client) and the backends hold every entry (every trace read), or `QUIET_S` after
  the run closed with some backend still refusing (its state says so). A run with evals waits up to
  `EVAL_GRACE_S` more while a checkpoint it evaluates has no score yet (rollout.tracking.entries'
  `evals_pending`), then logs what was held back for the evals that did not come. It lets go of each
  backend's run however it ends, a cancellation included; only a feed that ended with its run closes them
  for good.
- Files go under the runner's own directory (`tracking_dir`): W&B's under `wandb-files/`, MLflow's local
  store under `mlflow/`, the OTLP backend's positions under `otlp/`; nothing in the input names a path.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from rollout.ledger import Ledger
from rollout.tracking.entries import Entry, RunReader, evals_pending
from rollout.tracking.feed import Feed
from rollout.tracking.traces import TraceReader
from rollout.workflows import runner_stubs
from rollout.workflows.names import run_workflow_id
from rollout.workflows.tracking_types import TrackingInput, TrackingState

POLL_S = 2.0
QUIET_S = 30.0  # after the run closed, how long a refusing backend is still tried
EVAL_GRACE_S = 600.0  # after the run closed, how long evals of its last checkpoints are waited for


class TrackingActivities:
    def __init__(self, ledger: Ledger, tracking_dir: Path, *, poll_s: float = POLL_S) -> None:
        # W&B's runs here are this process's own service's: one named by an inherited WANDB_SERVICE (of the
        # shell or test that started the stack) may end first, or keep holding a run a restarted runner
        # opens again.
        os.environ.pop("WANDB_SERVICE", None)
        self.ledger = ledger
        self.tracking_dir = tracking_dir
        self.poll_s = poll_s

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.feed_tracking]

    @activity.defn(name=runner_stubs.feed_tracking.__name__)
    async def feed_tracking(self, given: TrackingInput) -> TrackingState:
        feed = Feed.of(given, self.tracking_dir)
        closed_at: float | None = None
        reader = RunReader(given)
        tracer = TraceReader(given) if given.otlp is not None else None
        ended = False
        newest = 0
        last_new = time.monotonic()
        beating = asyncio.create_task(self._beat(feed))  # the whole time, ledger reads and slow backends too
        try:
            while True:
                entries = await reader.read(self.ledger)
                if len(entries) != newest:
                    newest, last_new = len(entries), time.monotonic()
                await feed.push(entries + await self._traces(tracer, feed))
                activity.heartbeat(feed.state())
                if closed_at is None and await self._run_closed(given.run):
                    closed_at = time.monotonic()
                    continue  # one more read: what the run recorded as it closed
                if closed_at is not None:
                    quiet = time.monotonic() - max(closed_at, last_new)
                    if not evals_pending(entries, given.eval_every) or quiet > EVAL_GRACE_S:
                        # Over: what was held back for evals that will not come goes now, in step order.
                        entries = await reader.read(self.ledger, release=True)
                        entries += await self._traces(tracer, feed, release=True)
                        await feed.push(entries)
                        traced = tracer is None or tracer.caught_up
                        if (traced and not feed.behind(entries)) or quiet > QUIET_S:
                            ended = True
                            return feed.state()
                await asyncio.sleep(self.poll_s)
        finally:
            beating.cancel()
            # Also when cancelled (a retry may come to this same worker): W&B holds a run open in this
            # process until it is finished, and would refuse the retry's.
            await feed.close(final=ended)

    async def _traces(self, tracer: TraceReader | None, feed: Feed, *, release: bool = False) -> list[Entry]:
        """The trace entries past what the OTLP backend holds (none before the feed has asked it)."""
        held = feed.held("otlp")
        if tracer is None or held is None:
            return []
        return await tracer.read(self.ledger, held, release=release)

    async def _beat(self, feed: Feed) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            activity.heartbeat(feed.state())

    async def _run_closed(self, run: str) -> bool:
        try:
            description = await activity.client().get_workflow_handle(run_workflow_id(run)).describe()
        except RPCError:
            return False  # Temporal away, or no such run yet: keep feeding
        return description.status != WorkflowExecutionStatus.RUNNING
