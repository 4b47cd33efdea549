"""Typed client-side access to runs: start a `RunWorkflow`, or find one by its run's id.

Contract:
- A run's workflow id is `run_workflow_id(run)` and it plays on `RUNNER_QUEUE` unless told otherwise, so a
  caller needs only the run's id; the handles are typed (`WorkflowHandle[RunWorkflow, RunStatus]`), so
  `handle.result()` is a `RunStatus`.
- Callers spell no workflow, update or query name: they pass the handlers themselves, e.g.
  `await handle.query(RunWorkflow.status)`, `await handle.execute_update(RunWorkflow.pause)` (also `resume`,
  `stop`, and `set_max_lag` with a `MaxLagChange`); each update returns the run's `RunStatus` after it.
- `update_run` makes a `RunChange` (`PauseRun()`, `ResumeRun()`, `StopRun()`, `MaxLagChange(n)`: what
  `rollout run pause|resume|stop|set`, the dashboard and the gateway's operator routes send) through the run's
  update for it and returns the run's `RunStatus` after it; a run that is not playing raises
  `RunNotPlaying`, an update the run refuses (a bad max_lag) raises `RunUpdateRefused`, each with the reason;
  Temporal's own trouble is its `RPCError`, and an update sent again under the same `update_id` applies once.
- `run_state(client, run)` is the run workflow's execution status (RUNNING, COMPLETED, …; MISSING when there
  is none; NO_WORKER when it runs but no worker executes it, e.g. the stack is down; UNANSWERED when a worker
  polls its queue but did not answer the status query in time, e.g. busy) and, while it runs and answers, its
  own `RunStatus`. It answers at once when no worker polled the run's queue in the last 5 minutes, and within
  `STATUS_QUERY_TIMEOUT` otherwise (Temporal would hold a query 30 s).
- `failure_reason(error)` is the message a workflow's failure started from (the workflow failure wraps the
  activity's error, which wraps the worker's `ApplicationError`): what to show a person.
- Only temporalio and rollout.workflows are imported here: nothing heavy, nothing with side effects.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import FailureError
from temporalio.service import RPCError, RPCStatusCode

from rollout.run.settings import MaxLagChange, PauseRun, ResumeRun, RunChange, RunStatus, StopRun
from rollout.workflows.names import RUNNER_QUEUE, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput


async def start_run(
    client: Client, given: RunInput, *, task_queue: str = RUNNER_QUEUE
) -> WorkflowHandle[RunWorkflow, RunStatus]:
    """Start the `RunWorkflow` of `given.run` (id `run/{run}`) on `task_queue`, for runner workers to play.

    A run id in use by a running workflow is refused (`temporalio.exceptions.WorkflowAlreadyStartedError`);
    wait for the run's end with `await handle.result()`.
    """
    return await client.start_workflow(
        RunWorkflow.run, given, id=run_workflow_id(given.run), task_queue=task_queue
    )


def run_handle(client: Client, run: str) -> WorkflowHandle[RunWorkflow, RunStatus]:
    """The handle of run `run`'s `RunWorkflow` (its latest execution), for its status query and its updates.

    Nothing is checked here: a run that does not exist fails the first call made through the handle
    (`temporalio.service.RPCError`, status NOT_FOUND).
    """
    return client.get_workflow_handle_for(RunWorkflow.run, run_workflow_id(run))


# A live worker answers a status query in milliseconds; a loaded one (a trainer sharing two cores) in seconds.
STATUS_QUERY_TIMEOUT = timedelta(seconds=10)


async def run_state(client: Client, run: str) -> tuple[str, RunStatus | None]:
    """Run `run`'s workflow state and, while it runs and a worker answers, its `RunStatus` (see the
    contract)."""
    handle = run_handle(client, run)
    try:
        description = await handle.describe()
    except RPCError as error:
        return ("MISSING" if error.status == RPCStatusCode.NOT_FOUND else "UNKNOWN"), None
    state = description.status.name if description.status is not None else "UNKNOWN"
    if state != "RUNNING":
        return state, None
    if not await worker_polls(client, description.task_queue):
        return "NO_WORKER", None
    try:
        return state, await handle.query(RunWorkflow.status, rpc_timeout=STATUS_QUERY_TIMEOUT)
    except RPCError as error:
        # Temporal says so just before the deadline when no worker took the query; any other failure (the
        # deadline itself, a busy worker) leaves the run running, its own status unknown.
        return ("NO_WORKER" if "no poller seen" in error.message else "UNANSWERED"), None
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError):
        return "UNANSWERED", None


async def worker_polls(client: Client, task_queue: str) -> bool:
    """Whether a worker polled `task_queue` for workflow tasks in the last minutes (Temporal lists a poller
    for 5 minutes after its last poll); where the server will not say, assume one did (the query decides)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    try:
        return bool((await client.workflow_service.describe_task_queue(request)).pollers)
    except RPCError:
        return True


class RunNotPlaying(LookupError):
    """No workflow of that run is playing (never started, or already ended)."""


class RunUpdateRefused(ValueError):
    """The run's workflow refused the update (its validator said why)."""


async def update_run(
    client: Client, run: str, change: RunChange, *, update_id: str | None = None
) -> RunStatus:
    """Make `change` to run `run` through its workflow's update and return the run's status after it. Sent
    again with the same `update_id`, an update the run has taken already is not applied twice. Temporal's own
    trouble (`RPCError`s other than NOT_FOUND) is raised as it is, for the caller to wait out."""
    handle = run_handle(client, run)
    try:
        match change:
            case MaxLagChange():
                return await handle.execute_update(RunWorkflow.set_max_lag, change, id=update_id)
            case PauseRun():
                return await handle.execute_update(RunWorkflow.pause, id=update_id)
            case ResumeRun():
                return await handle.execute_update(RunWorkflow.resume, id=update_id)
            case StopRun():
                return await handle.execute_update(RunWorkflow.stop, id=update_id)
    except WorkflowUpdateFailedError as error:
        raise RunUpdateRefused(str(error.cause)) from error
    except RPCError as error:
        if error.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
            raise
        raise RunNotPlaying(f"no run {run!r} is playing ({error.message})") from error


def failure_reason(error: BaseException) -> str:
    """The innermost cause of `error`'s chain: a Temporal failure's own message, or the exception's text."""
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    return cause.message if isinstance(cause, FailureError) else str(cause)
