"""How long the workflows wait on an activity, in one place.

Contract: no activity can sit on a dead worker for more than about `DEAD_WORKER_S`. Each activity either
heartbeats (long or open-ended work: playing an agent, assembling a batch, a training step, converting a
checkpoint; the activity side uses `rollout.activities.heartbeat.heartbeating`) with a heartbeat timeout of at
most `DEAD_WORKER_S`, or is a short ledger write whose start-to-close timeout is `DEAD_WORKER_S`. A timed-out
attempt is retried, on whichever worker polls first: every activity is idempotent by its ledger keys.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

DEAD_WORKER_S = 30
DEAD_WORKER = timedelta(seconds=DEAD_WORKER_S)

# A single ledger write or lease update: quick, and retried until it lands (the ledger rides out its own
# restarts for two minutes per attempt, so a timeout here means the worker died).
QUICK: dict[str, Any] = {
    "start_to_close_timeout": DEAD_WORKER,
    "retry_policy": RetryPolicy(maximum_interval=timedelta(seconds=10)),
}


def heartbeating(limit: timedelta, retry_policy: RetryPolicy | None = None) -> dict[str, Any]:
    """Options for long work that heartbeats: at most `limit` in all, taken for dead after `DEAD_WORKER`."""
    return {
        "start_to_close_timeout": limit,
        "heartbeat_timeout": DEAD_WORKER,
        "retry_policy": retry_policy or RetryPolicy(maximum_interval=timedelta(seconds=10)),
    }
