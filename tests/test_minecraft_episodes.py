"""minecraft_team episodes across real processes: four runner workers (one activity slot each, so each agent
plays on its own runner), a `rollout sandbox serve --kind minecraft` process, the scripted engine and gateway,
under a real Temporal dev server and Postgres.

What must hold: when the world's server is SIGKILLed mid-episode the episode is abandoned (none of its turns
trained); the next episode plays on a fresh world, its four agents on four runners, each seeing the other
three, all four rewards recorded and the claim released. (One test: the processes take a minute to start.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import held_sandbox
from rollout.ledger.streams import run_episodes_stream
from rollout.run.settings import RunStatus
from rollout.sandbox.hosting import sandbox_workdir
from rollout.workflows.names import agent_workflow_id, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout_testing.cluster import Cluster
from tests.test_chaos_episodes import play_attempts, seat_turns, wait_for

pytestmark = pytest.mark.slow
AGENTS = ("alex", "blake", "casey", "drew")


def four_runners(cluster: Cluster, think_ms: float) -> tuple[str, str]:
    gateway = cluster.gateway(cluster.engine(think_ms=think_ms))
    name = f"mc-{uuid.uuid4().hex[:6]}"
    cluster.sandbox("minecraft", name, seats=4)
    for index in range(4):
        cluster.runner(f"runner-{index}", gateway, max_activities=1)
    return gateway, name


@pytest.mark.timeout(480)
async def test_a_world_killed_mid_episode_is_abandoned_and_the_next_builds_on_four_runners_in_a_fresh_one(
    cluster: Cluster, ledger: Ledger, minecraft_home: Path
) -> None:
    _, name = four_runners(cluster, think_ms=700)
    client = await Client.connect(cluster.settings.temporal_address)
    run = f"mc-kill-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        RunWorkflow.run,
        RunInput(run, "tests.example_envs:minecraft_four", groups_in_flight=1, max_groups=2),
        id=run_workflow_id(run),
        task_queue=cluster.task_queue,
    )
    first = "g000000-0"

    async def playing() -> bool:
        return len(await seat_turns(ledger, f"{run}/{first}/alex/a1")) >= 1

    await wait_for(playing, 180, "the first episode to be a turn in")
    world_pid = int((sandbox_workdir(cluster.root, "minecraft", name) / "world.pid").read_text())
    os.killpg(world_pid, signal.SIGKILL)

    status: RunStatus = await asyncio.wait_for(handle.result(), 360)
    assert status.episodes_finished == 1 and status.episodes_failed == 1, status
    events = await ledger.read(run_episodes_stream(run))
    ended = {e.payload["episode"]: e for e in events if "attempt" not in e.payload}
    assert ended[first].kind == Kind.EPISODE_ABANDONED, (
        "the episode whose world died is abandoned, never trained"
    )
    assert "lost" in (ended[first].payload.get("error") or ""), ended[first].payload
    second = ended["g000001-0"]
    assert second.kind == Kind.EPISODE_FINISHED, second.payload
    payload = second.payload
    assert payload["rewards"] == dict.fromkeys(AGENTS, 1.0), payload["rewards"]
    for agent in AGENTS:
        metrics = payload["metrics"][agent]
        assert metrics["others_seen"] == 3, f"{agent} did not see the other three bots: {metrics}"
        assert metrics["pillar_height"] == 4 and metrics["own_block"] == 1
    runners = set()
    for agent in AGENTS:
        attempts = await play_attempts(client, agent_workflow_id(run, payload["episode"], agent))
        runners.add(attempts[-1][1])
    assert len(runners) == 4, f"the four agents played on four runner processes: {runners}"
    assert await held_sandbox(ledger, "minecraft", f"{run}/{payload['episode']}") is None, (
        "the claim is released"
    )
    dead_epoch = int(ended[first].payload["sandbox"].rsplit("@", 1)[1])
    assert int(second.payload["sandbox"].rsplit("@", 1)[1]) > dead_epoch, (
        "the next episode had a claim of its own"
    )
    # The world restarted for the new claim: a process other than the one killed.
    assert int((sandbox_workdir(cluster.root, "minecraft", name) / "world.pid").read_text()) != world_pid
