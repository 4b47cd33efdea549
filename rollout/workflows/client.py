"""Typed client-side access to runs: start a `RunWorkflow`, or find one by its run's id.

Contract:
- A run's workflow id is `run_workflow_id(run)` and it plays on `RUNNER_QUEUE` unless told otherwise, so a
  caller needs only the run's id; the handles are typed (`WorkflowHandle[RunWorkflow, RunStatus]`), so
  `handle.result()` is a `RunStatus`.
- Callers spell no workflow, update or query name: they pass the handlers themselves, e.g.
  `await handle.query(RunWorkflow.status)`, `await handle.execute_update(RunWorkflow.pause)` (also `resume`,
  `stop`, and `set_max_lag` with the new lag); each update returns the run's `RunStatus` after it.
- Only temporalio and rollout.workflows are imported here: nothing heavy, nothing with side effects.
"""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle

from rollout.workflows.names import RUNNER_QUEUE, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.types import RunInput, RunStatus


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
