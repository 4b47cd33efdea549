"""`TrackingWorkflow`: a training run's metrics fed to W&B and MLflow, once each, while it trains and after.

Contract:
- One per run (`names.tracking_workflow_id(run)`), started beside the run when `tracking.backends` names a
  backend. It runs one long activity, `feed_tracking` (rollout.activities.tracking), on the runner queue: the
  activity follows the ledger until the run has ended and every record is logged, then returns. A runner that
  dies mid-feed is replaced (heartbeats), and the feed goes on from where each backend says it is: no worker
  holds state, and this workflow records nothing. It returns the feed's last `TrackingState`.
- `TrackingInput` holds what the backends are told: their names, projects, URIs, tags and the run's settings
  to log as its config. It never holds a secret (API keys are the backends' own environment variables), and
  where files go is the runner's choice (its data directory), never the input's.
- The feed never touches training: a backend that is down is retried with a bound by the activity, which
  reports its state in its heartbeat (`TrackingState`, read by `rollout status` and the live line).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from rollout.workflows import runner_stubs
from rollout.workflows.tracking_types import TrackingInput, TrackingState

FEED_LIMIT = timedelta(days=365)  # as long as a run plays: the run's end ends the feed
FEED_HEARTBEAT = timedelta(seconds=10)


@workflow.defn
class TrackingWorkflow:
    @workflow.run
    async def run(self, given: TrackingInput) -> TrackingState:
        return await workflow.execute_activity(
            runner_stubs.feed_tracking,
            given,
            start_to_close_timeout=FEED_LIMIT,
            # Short: Temporal passes on a heartbeat's details at most every 0.8 × this, and they are how a
            # refusing backend shows in `run status` and the live line.
            heartbeat_timeout=FEED_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
        )
