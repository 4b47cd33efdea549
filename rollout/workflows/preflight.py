"""`EnvironmentCheckWorkflow`: before a run starts, a runner confirms it can load the run's environment.

Contract: it runs `describe_environment` on the runner queue and returns what it found, or fails with the
runner's `EnvironmentLoadError` (naming the module and why it does not import; never retried). A runner that
dies during the check is replaced: the check is tried again on another (or the restarted) runner, up to 3
times. It records nothing: a failed check leaves no run behind. Its id is `names.preflight_workflow_id(run)`;
the caller bounds how long it waits for a runner to pick it up (none polling is its own error).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from rollout.workflows import runner_stubs
from rollout.workflows.episode_types import EnvironmentInfo
from rollout.workflows.options import heartbeating


@workflow.defn
class EnvironmentCheckWorkflow:
    @workflow.run
    async def run(self, reference: str) -> EnvironmentInfo:
        return await workflow.execute_activity(
            runner_stubs.describe_environment,
            reference,
            **heartbeating(timedelta(minutes=2), RetryPolicy(maximum_attempts=3)),
        )
