"""Chaos for episodes: real processes (scripted engine, gateway, runner workers, sandbox servers) killed and
restarted under a real Temporal dev server and a real Postgres.

What must hold: an episode keeps playing through a dead runner (the retried attempt replays the recorded
turns, each turn is in the ledger once); two agents on two runner processes share one sandbox; a paused run
survives a restart of every process and finishes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.client import Client

from rollout.ledger import Kind, Ledger
from rollout.ledger.streams import run_episodes_stream, run_stream, seat_stream
from rollout.run.settings import RunStatus
from rollout.stack.embedded import Stack
from rollout.workflows import runner_stubs
from rollout.workflows.names import agent_workflow_id, episode_workflow_id, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout_testing.cluster import Cluster
from rollout_testing.stacks import isolated_settings

pytestmark = pytest.mark.slow
# A one-seat episode plays (and records) in `play_episode`; a seat of a multi-agent one in `play_agent`.
PLAYS = {runner_stubs.play_agent.__name__, runner_stubs.play_episode.__name__}


async def seat_turns(ledger: Ledger, seat: str) -> list[str]:
    return [e.key for e in await ledger.read(seat_stream(seat)) if e.kind == Kind.TURN_RECORDED]


async def wait_for[T](condition: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := await condition():
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")


async def play_attempts(client: Client, workflow_id: str) -> list[tuple[int, str]]:
    """(attempt, worker identity) of every start of a play activity in the workflow, from Temporal's
    history."""
    handle = client.get_workflow_handle(workflow_id)
    scheduled: dict[int, str] = {}
    started = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        if event.HasField("activity_task_started_event_attributes"):
            attributes = event.activity_task_started_event_attributes
            if scheduled.get(attributes.scheduled_event_id) in PLAYS:
                started.append((attributes.attempt, attributes.identity))
    return started


async def test_a_runner_killed_mid_episode_is_replaced_and_each_turn_is_recorded_once(
    cluster: Cluster, ledger: Ledger
) -> None:
    gateway = cluster.gateway(cluster.engine(think_ms=400))
    doomed = cluster.runner("runner-1", gateway)
    client = await Client.connect(cluster.settings.temporal_address)
    run = f"kill-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        RunWorkflow.run,
        RunInput(run, "gridworld.environment:environment", groups_in_flight=1, max_groups=1),
        id=run_workflow_id(run),
        task_queue=cluster.task_queue,
    )
    seats = [f"{run}/g000000-{member}/solver" for member in range(4)]

    async def midway() -> list[int] | None:
        counts = [len(await seat_turns(ledger, seat)) for seat in seats]
        return counts if min(counts) >= 3 else None

    before = await wait_for(midway, 120, "every episode to be 3 turns in")
    doomed.kill()
    assert max(before) < 10, f"the episodes finished before the kill: {before}"
    cluster.runner("runner-2", gateway)
    status: RunStatus = await asyncio.wait_for(handle.result(), 180)
    assert status.episodes_finished == 4 and status.episodes_failed == 0
    finished = [e for e in await ledger.read(run_episodes_stream(run)) if e.kind == Kind.EPISODE_FINISHED]
    assert {e.payload["episode"] for e in finished} == {f"g000000-{m}" for m in range(4)}
    for episode in finished:
        assert episode.payload["rewards"] == {"solver": 1.0} and episode.payload["turns"] == {"solver": 10}
    for seat in seats:
        keys = await seat_turns(ledger, seat)
        assert len(keys) == len(set(keys)) == 10, f"{seat}: each of the 10 turns once, got {keys}"
    attempts = await play_attempts(client, episode_workflow_id(run, "g000000-0"))  # one seat: played inline
    assert attempts and attempts[-1][0] == 2, (
        f"the play activity was retried once, on the second runner: {attempts}"
    )


async def test_two_agents_on_two_runner_processes_share_one_sandbox(cluster: Cluster, ledger: Ledger) -> None:
    gateway = cluster.gateway(cluster.engine(think_ms=50))
    cluster.sandbox("gridworld.shared:grid", f"grid-{uuid.uuid4().hex[:6]}", seats=2)
    # One activity at a time per runner: agents A and B of an episode must play on different runners.
    cluster.runner("runner-1", gateway, max_activities=1)
    cluster.runner("runner-2", gateway, max_activities=1)
    client = await Client.connect(cluster.settings.temporal_address)
    run = f"pair-{uuid.uuid4().hex[:6]}"
    status: RunStatus = await asyncio.wait_for(
        client.execute_workflow(
            RunWorkflow.run,
            RunInput(run, "tests.example_envs:gridworld_pair", groups_in_flight=1, max_groups=2),
            id=run_workflow_id(run),
            task_queue=cluster.task_queue,
        ),
        240,
    )
    assert status.episodes_finished == 2 and status.episodes_failed == 0
    finished = [e for e in await ledger.read(run_episodes_stream(run)) if e.kind == Kind.EPISODE_FINISHED]
    assert len({e.payload["sandbox"] for e in finished}) == 2, "each episode claimed the sandbox anew"
    for episode in finished:
        payload = episode.payload
        assert payload["rewards"] == {"A": 1.0, "B": 1.0}, payload
        # Whoever moves last sees the other's moves (at its join or a later move) whatever the timing;
        # both seeing some needs the two runners to overlap, which a loaded machine does not promise.
        seen = [payload["metrics"][agent]["others_moves_seen"] for agent in ("A", "B")]
        assert max(seen) > 0, f"neither agent saw the other move: the grid was not shared ({seen})"
        a = await play_attempts(client, agent_workflow_id(run, payload["episode"], "A"))
        b = await play_attempts(client, agent_workflow_id(run, payload["episode"], "B"))
        assert a[-1][1] != b[-1][1], f"A and B played on different runner processes: {a} {b}"


async def test_a_paused_run_survives_a_restart_of_every_process_and_finishes(
    tmp_path: Path, models_dir: Path, tiny_qwen3: str
) -> None:
    settings = isolated_settings(tmp_path / "stack")
    stack = Stack(settings)
    cluster = Cluster(
        settings=settings, root=tmp_path / "cluster", models_dir=models_dir, task_queue="restart-runner"
    )
    run = "restart"

    def start_services() -> None:
        assert all(s.healthy for s in stack.up()), "the stack did not come up"
        gateway = cluster.gateway(cluster.engine(think_ms=300))
        cluster.runner("runner-1", gateway)
        cluster.runner("runner-2", gateway)

    try:
        await asyncio.to_thread(start_services)
        client = await Client.connect(settings.temporal_address)
        handle = await client.start_workflow(
            RunWorkflow.run,
            RunInput(run, "gridworld.environment:environment", groups_in_flight=1, max_groups=2),
            id=run_workflow_id(run),
            task_queue=cluster.task_queue,
        )
        async with await Ledger.connect(settings.ledger_url) as ledger:

            async def playing() -> int | None:
                turns = len(await seat_turns(ledger, f"{run}/g000000-0/solver"))
                return turns if turns >= 2 else None

            await wait_for(playing, 120, "the first episode to be 2 turns in")
            paused: RunStatus = await handle.execute_update(RunWorkflow.pause)
            assert paused.paused
        # Every process stops while episodes are in flight: runners, gateway, engine, Temporal, Postgres.
        cluster.close()
        await asyncio.to_thread(stack.down)
        assert stack.temporal is not None and stack.temporal.pid() is None

        await asyncio.to_thread(start_services)
        client = await Client.connect(settings.temporal_address)
        handle = client.get_workflow_handle_for(RunWorkflow.run, run_workflow_id(run))
        assert (await handle.query(RunWorkflow.status)).paused, "the run is still paused after the restart"
        await handle.execute_update(RunWorkflow.resume)
        status: RunStatus = await asyncio.wait_for(handle.result(), 240)
        assert status.episodes_finished == 8 and status.episodes_failed == 0 and not status.paused
        async with await Ledger.connect(settings.ledger_url) as ledger:
            finished = [
                e for e in await ledger.read(run_episodes_stream(run)) if e.kind == Kind.EPISODE_FINISHED
            ]
            assert len(finished) == 8 and all(e.payload["rewards"] == {"solver": 1.0} for e in finished)
            for episode in finished:
                keys = await seat_turns(ledger, episode.payload["seats"]["solver"])
                assert len(keys) == len(set(keys)) == 10, "each turn once, across the restart"
            changes = [
                e.payload["changes"]
                for e in await ledger.read(run_stream(run))
                if e.kind == Kind.SETTINGS_CHANGED
            ]
            assert changes == [{"paused": True}, {"paused": False}]
            resumed_at = max(
                e.recorded_at for e in await ledger.read(run_stream(run)) if e.kind == Kind.SETTINGS_CHANGED
            )
            second_group = [e for e in finished if e.payload["group"] == 1]
            assert all(e.recorded_at > resumed_at for e in second_group), "no new group started while paused"
    finally:
        cluster.close()
        await asyncio.to_thread(stack.down)
