"""The embedded Temporal dev server runs real workflows."""

import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from rollout.config import Settings


@activity.defn
async def shout(text: str) -> str:
    return text.upper()


@workflow.defn(sandboxed=False)
class Echo:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(shout, text, start_to_close_timeout=timedelta(seconds=30))


async def test_a_workflow_runs_on_the_embedded_dev_server(stack_settings: Settings) -> None:
    client = await Client.connect(stack_settings.temporal_address)
    queue = f"test-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[Echo], activities=[shout]):
        result = await client.execute_workflow(Echo.run, "hello", id=f"echo/{queue}", task_queue=queue)
    assert result == "HELLO"
