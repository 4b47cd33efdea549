"""What Temporal says about runs' workflows and its workers, as the faces show it (the dashboard's Runs and
Machines views).

Contract: each call takes a connected client and answers typed rows or words, never raising for a workflow
Temporal does not have: `run_state(client, run)` is the state of a run's workflow in a word ("running",
"completed", …, or "no workflow"); `run_states(client, limit)` is every listed run's state from one visibility
listing (newest executions first), an eval run's (played by an `EvalWorkflow`) being its episode supply's;
`run_workflows(client, run, limit)` is every workflow of one run (`WorkflowRow`, the run's own and those under
it); `queue_pollers(client, namespace)` is, for each of the runner and trainer queues and each kind of task,
how many workers poll it (`QueuePollers`). Temporal that does not answer raises its own error (`RPCError`, or
`RuntimeError` when no client connects); the caller says it on the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from rollout.workflows.names import RUNNER_QUEUE, TRAINER_QUEUE, run_workflow_id, supply_workflow_id

if TYPE_CHECKING:
    from temporalio.client import Client

RUN_STATES_QUERY = "WorkflowType = 'RunWorkflow' OR WorkflowType = 'EpisodeSupplyWorkflow'"


@dataclass(frozen=True)
class WorkflowRow:
    workflow_id: str
    workflow_type: str
    state: str  # running, completed, failed, …, or unknown
    started: datetime


@dataclass(frozen=True)
class QueuePollers:
    queue: str
    polls_for: str  # workflows | activities
    workers: int
    identities: list[str]  # each polling worker's identity, sorted


async def run_state(client: Client, run: str) -> str:
    from temporalio.service import RPCError

    from rollout.workflows.client import run_handle

    try:
        description = await run_handle(client, run).describe()
    except RPCError:
        return "no workflow"
    return description.status.name.lower() if description.status is not None else "unknown"


async def run_states(client: Client, limit: int) -> dict[str, str]:
    prefix, suffix = run_workflow_id(""), supply_workflow_id("").removeprefix(run_workflow_id(""))
    owners: dict[str, str] = {}
    supplies: dict[str, str] = {}
    async for execution in client.list_workflows(RUN_STATES_QUERY, limit=limit):
        if execution.status is None:
            continue
        state = execution.status.name.lower()
        if execution.workflow_type == "RunWorkflow":
            owners.setdefault(execution.id.removeprefix(prefix), state)
        else:
            supplies.setdefault(execution.id.removeprefix(prefix).removesuffix(suffix), state)
    return supplies | owners


async def run_workflows(client: Client, run: str, limit: int) -> list[WorkflowRow]:
    root = _quoted(run_workflow_id(run))
    query = f"WorkflowId = '{root}' OR WorkflowId STARTS_WITH '{root}/'"
    return [
        WorkflowRow(
            execution.id,
            execution.workflow_type,
            execution.status.name.lower() if execution.status is not None else "unknown",
            execution.start_time,
        )
        async for execution in client.list_workflows(query, limit=limit)
    ]


async def queue_pollers(client: Client, namespace: str) -> list[QueuePollers]:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    rows = []
    for queue in (RUNNER_QUEUE, TRAINER_QUEUE):
        for kind, label in (
            (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, "workflows"),
            (TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, "activities"),
        ):
            found = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
                )
            )
            rows.append(
                QueuePollers(queue, label, len(found.pollers), sorted({p.identity for p in found.pollers}))
            )
    return rows


def _quoted(text: str) -> str:
    # A visibility query's string literal: a run name cannot end it early.
    return text.replace("\\", "\\\\").replace("'", "\\'")
