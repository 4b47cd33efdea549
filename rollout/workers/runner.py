"""The runner worker: plays episodes. Several may run, on several machines, all on one task queue.

Contract: `runner_worker` registers the episode, run, eval and tracking workflows and the runner's activities
(one implementation of each stub in rollout.workflows.runner_stubs: `RunnerActivities.all()`,
`EvalActivities.all()` and `TrackingActivities.all()`) on the runner queue; the tracking feed writes its files
(W&B's, MLflow's local store) under `tracking_dir` (the data directory's `tracking/`), or a temporary one
when none is given. Workflows run without Temporal's sandbox: their determinism rests on the rules in
rollout.workflows.episodes (no I/O, no clocks, no randomness outside `workflow.*`, activities called through
their stubs). Activities get the ledger, the gateway's base URL, the seat secret (the
gateway's, shared by file) and the sandbox key (shared with the sandbox hosts, rollout.sandbox.keys) from the
caller; a runner holds no state of its own, so killing one loses nothing: its activities are retried elsewhere
once their heartbeats stop.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollout.activities.evals import EvalActivities
from rollout.activities.runner import RunnerActivities
from rollout.activities.tracking import TrackingActivities
from rollout.config import SandboxIsolation
from rollout.ledger import Ledger
from rollout.workflows.episodes import AgentWorkflow, EpisodeSupplyWorkflow, EpisodeWorkflow
from rollout.workflows.evals import EvalWorkflow
from rollout.workflows.names import RUNNER_QUEUE
from rollout.workflows.preflight import EnvironmentCheckWorkflow
from rollout.workflows.run import RunWorkflow
from rollout.workflows.tracking import TrackingWorkflow

WORKFLOWS = [
    RunWorkflow,
    EpisodeSupplyWorkflow,
    EpisodeWorkflow,
    AgentWorkflow,
    EnvironmentCheckWorkflow,
    EvalWorkflow,
    TrackingWorkflow,
]


def runner_worker(
    client: Client,
    ledger: Ledger,
    *,
    gateway_url: str,
    seat_secret: bytes,
    sandbox_key: bytes,
    task_queue: str = RUNNER_QUEUE,
    max_concurrent_activities: int = 64,
    outage_window_s: float = 600.0,
    isolation: SandboxIsolation = SandboxIsolation.bwrap,
    command_pool: str = "",
    tracking_dir: Path | None = None,
) -> Worker:
    activities = RunnerActivities(
        ledger,
        gateway_url=gateway_url,
        seat_secret=seat_secret,
        sandbox_key=sandbox_key,
        outage_window_s=outage_window_s,
        isolation=isolation,
        command_pool=command_pool,
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=[
            *activities.all(),
            *EvalActivities(ledger).all(),
            *TrackingActivities(
                ledger, tracking_dir or Path(tempfile.mkdtemp(prefix="rollout-tracking-"))
            ).all(),
        ],
        max_concurrent_activities=max_concurrent_activities,
        # The workflow modules import only the standard library, temporalio, rollout.workflows and light core
        # records (rollout.environment, rollout.records, ...), and are deterministic by construction; the
        # sandbox's per-run module reloads cost ~25 ms of CPU per workflow task on a 2-core machine, a third
        # of a one-turn episode's overhead (benchmarks/RESULTS.md).
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
