"""Runs and episodes as Temporal workflows: a real dev server, real Postgres, a real gateway and runner
worker."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollout.activities.batches import load_batch, look_for_batch, record_batch
from rollout.activities.runner import RunnerActivities
from rollout.config import Settings, defaults
from rollout.contracts import Message
from rollout.control.progress import TrainingProgress
from rollout.engines.scripted import ScriptedEngine
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import find_lease, find_run, live_lease_holder
from rollout.ledger.streams import (
    run_batches_stream,
    run_episodes_stream,
    run_stream,
    sandbox_lease,
    seat_stream,
)
from rollout.records.batches import BatchInfo
from rollout.rendering import ModelRenderer
from rollout.run.settings import MaxLagChange, RunSettings, RunStatus
from rollout.sandbox.hosting import hosted_sandbox
from rollout.sandbox.keys import kind_key
from rollout.workers.runner import runner_worker
from rollout.workflows import runner_stubs, trainer_stubs
from rollout.workflows.bridges import BridgeWorkflow
from rollout.workflows.client import run_handle, start_run
from rollout.workflows.episode_types import AgentAttempt
from rollout.workflows.episodes import EpisodeWorkflow
from rollout.workflows.names import episode_id, episode_workflow_id, run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout.workflows.training import TrainingWorkflow
from rollout.workflows.training_types import (
    AssembleInput,
    BatchLookup,
    CheckpointInfo,
    TrainingSpec,
    TrainStepInput,
)
from tests.gatewayutil import serve_gateway
from tests.sandboxutil import SANDBOX_KEY


def solve(prompt: str) -> Message:
    """A scripted model that does arithmetic: it answers the last question in the prompt correctly."""
    found = re.findall(r"What is (-?\d+) ([+*-]) (-?\d+)\?", prompt)
    if not found:
        return Message.assistant("I do not know.")
    a, op, b = found[-1]
    return Message.assistant(str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]))


@pytest.fixture
async def runner(
    stack_settings: Settings, ledger: Ledger, renderer: ModelRenderer
) -> AsyncIterator[tuple[Client, str]]:
    client = await Client.connect(stack_settings.temporal_address)
    queue = f"runner-{uuid.uuid4().hex[:8]}"
    async with serve_gateway(ledger, renderer, ScriptedEngine(renderer, solve)) as gateway:
        worker: Worker = runner_worker(
            client,
            ledger,
            gateway_url=gateway.url,
            seat_secret=b"s" * 32,
            sandbox_key=SANDBOX_KEY,
            task_queue=queue,
        )
        async with worker:
            yield client, queue


def causes(error: BaseException | None) -> str:
    """Every message down an exception's cause chain (Temporal nests the activity's error in two wrappers)."""
    messages = []
    while error is not None:
        messages.append(str(error))
        error = error.__cause__
    return " <- ".join(messages)


async def events(ledger: Ledger, stream: str) -> list[Any]:
    return await ledger.read(stream)


async def test_a_run_plays_its_groups_and_records_every_episode_once(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    client, queue = runner
    run = f"arith-{uuid.uuid4().hex[:6]}"
    status: RunStatus = await client.execute_workflow(
        RunWorkflow.run,
        RunInput(run, "arithmetic.environment:environment", groups_in_flight=2, max_groups=2),
        id=run_workflow_id(run),
        task_queue=queue,
    )
    assert status.episodes_finished == 8 and status.episodes_failed == 0 and status.groups_finished == 2
    finished = [e for e in await events(ledger, run_episodes_stream(run)) if e.kind == Kind.EPISODE_FINISHED]
    assert sorted(e.key for e in finished) == sorted(
        f"g{g:06d}-{m}/finished" for g in range(2) for m in range(4)
    )
    assert all(e.payload["rewards"] == {"solver": 1.0} for e in finished), (
        "the scripted model does arithmetic"
    )
    seats = [e.payload["seats"]["solver"] for e in finished]
    for seat in seats:
        kinds = [e.kind for e in await events(ledger, seat_stream(seat))]
        assert kinds == [Kind.SEAT_OPENED, Kind.TURN_RECORDED, Kind.SEAT_CLOSED]
    # A group's episodes play the same task (group-relative advantages compare like with like).
    prompts = {}
    for seat in seats:
        turn = next(e for e in await events(ledger, seat_stream(seat)) if e.kind == Kind.TURN_RECORDED)
        prompts.setdefault(seat.split("/")[1][:7], set()).add(tuple(turn.payload["prompt_ids_delta"]))
    assert [len(p) for p in prompts.values()] == [1, 1]
    created = await find_run(ledger, run)
    assert created is not None and created.settings.max_lag == defaults.MAX_LAG  # the one default
    # One seat, replayable, no sandbox: played and recorded in one activity.
    history = await client.get_workflow_handle(episode_workflow_id(run, episode_id(0, 0))).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled == [runner_stubs.play_episode.__name__]


async def test_a_play_retried_after_its_episode_was_recorded_plays_nothing_and_records_nothing(
    runner: tuple[Client, str], ledger: Ledger, renderer: ModelRenderer
) -> None:
    """A runner that dies between recording an episode and reporting it gets its play retried: the retry must
    return what was recorded (the seat is closed by then) and record nothing more."""
    client, queue = runner
    run = f"retry-{uuid.uuid4().hex[:6]}"
    await client.execute_workflow(
        RunWorkflow.run,
        RunInput(run, "arithmetic.environment:environment", groups_in_flight=1, max_groups=1),
        id=run_workflow_id(run),
        task_queue=queue,
    )
    handle = client.get_workflow_handle_for(EpisodeWorkflow.run, episode_workflow_id(run, episode_id(0, 0)))
    first = await handle.result()
    scheduled = next(
        e.activity_task_scheduled_event_attributes
        for e in (await handle.fetch_history()).events
        if e.HasField("activity_task_scheduled_event_attributes")
    )
    [attempt] = await client.data_converter.decode(scheduled.input.payloads, [AgentAttempt])
    before = await events(ledger, run_episodes_stream(run))
    async with serve_gateway(ledger, renderer, ScriptedEngine(renderer, solve)) as gateway:
        activities = RunnerActivities(
            ledger, gateway_url=gateway.url, seat_secret=b"s" * 32, sandbox_key=SANDBOX_KEY
        )
        again = await ActivityEnvironment().run(activities.play_episode, attempt)
    assert again == first
    assert await events(ledger, run_episodes_stream(run)) == before


async def test_updates_change_the_runs_settings_in_the_ledger(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    client, queue = runner
    run = f"upd-{uuid.uuid4().hex[:6]}"
    handle = await start_run(
        client, RunInput(run, "arithmetic.environment:environment", groups_in_flight=1), task_queue=queue
    )
    paused = await handle.execute_update(RunWorkflow.pause)
    assert paused.paused
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(RunWorkflow.set_max_lag, MaxLagChange(-1))
    assert (await handle.execute_update(RunWorkflow.set_max_lag, MaxLagChange(3))).max_lag == 3
    row = await find_run(ledger, run)
    assert row is not None and row.settings.paused and row.settings.max_lag == 3
    assert (await run_handle(client, run).query(RunWorkflow.status)).paused
    await handle.execute_update(RunWorkflow.resume)
    await handle.execute_update(RunWorkflow.stop)
    final = await handle.result()
    assert final.stopped and not final.paused
    changes = [
        e.payload["changes"] for e in await events(ledger, run_stream(run)) if e.kind == Kind.SETTINGS_CHANGED
    ]
    assert changes == [{"paused": True}, {"max_lag": 3}, {"paused": False}, {"stopped": True}]


async def test_a_task_that_raises_fails_its_episode_and_the_run_goes_on(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    client, queue = runner
    for reference, expected, kind in (
        (
            "tests.example_envs:raises",
            "respond raised RuntimeError: the environment broke on purpose",
            "TaskFailed",
        ),
        ("tests.example_envs:not_finite", "the task's reward nan is not a finite number", "InvalidReward"),
    ):
        run = f"bad-{uuid.uuid4().hex[:6]}"
        status = await client.execute_workflow(
            RunWorkflow.run, RunInput(run, reference, max_groups=2), id=run_workflow_id(run), task_queue=queue
        )
        assert status.episodes_failed == 2 and status.episodes_finished == 0
        failed = [
            e for e in await events(ledger, run_episodes_stream(run)) if e.kind == Kind.EPISODE_ABANDONED
        ]
        assert len(failed) == 2 and expected in failed[0].payload["error"]
        assert failed[0].payload["trainable"] is False
        failure = failed[0].payload["failure"]
        assert failure["kind"] == kind and failure["reason"].startswith(expected), failure
        assert failure["where"] and failure["where"].startswith("tests/example_envs.py:"), failure
        # Deterministic: played once, never retried (a retry would fail the same way).
        episode = client.get_workflow_handle(episode_workflow_id(run, failed[0].payload["episode"]))
        attempts = [
            e.activity_task_started_event_attributes.attempt
            async for e in episode.fetch_history_events()
            if e.HasField("activity_task_started_event_attributes")
        ]
        assert attempts and set(attempts) == {1}, attempts


async def test_a_run_whose_episodes_keep_failing_pauses_itself_saying_why(runner: tuple[Client, str]) -> None:
    client, queue = runner
    run = f"failing-{uuid.uuid4().hex[:6]}"
    given = RunInput(run, "tests.example_envs:raises", max_failure_rate=0.5, failure_window=3)
    handle = await client.start_workflow(RunWorkflow.run, given, id=run_workflow_id(run), task_queue=queue)
    deadline = asyncio.get_running_loop().time() + 120
    while not (status := await handle.query(RunWorkflow.status)).paused:
        assert asyncio.get_running_loop().time() < deadline, "the run never paused itself"
        await asyncio.sleep(0.5)
    assert status.pause_reason is not None
    assert status.pause_reason.startswith(
        "3 of the last 3 episodes failed (more than run.max_failure_rate=0.5)"
    )
    assert "respond raised RuntimeError: the environment broke on purpose" in status.pause_reason
    await handle.execute_update(RunWorkflow.stop)
    stopped = await handle.result()
    assert stopped.stopped and stopped.episodes_finished == 0


async def test_an_environment_that_does_not_load_fails_the_run_naming_it(runner: tuple[Client, str]) -> None:
    client, queue = runner
    for reference, expected in (
        ("tests.no_such_module:env", "does not import"),
        ("tests.example_envs:not_an_environment", "not a rollout.environment.Environment"),
        ("arithmetic", "package.module:attribute"),
    ):
        run = f"noenv-{uuid.uuid4().hex[:6]}"
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(
                RunWorkflow.run, RunInput(run, reference), id=run_workflow_id(run), task_queue=queue
            )
        assert expected in causes(failure.value)


async def test_episodes_claim_a_shell_sandbox_and_release_it(
    runner: tuple[Client, str], ledger: Ledger, tmp_path: Path
) -> None:
    client, queue = runner
    run = f"shell-{uuid.uuid4().hex[:6]}"
    async with hosted_sandbox(
        ledger,
        "shell#episodes-test",
        "box-0",
        seats=1,
        workdir=tmp_path / "box",
        key=kind_key(SANDBOX_KEY, "shell#episodes-test"),
    ):
        status = await client.execute_workflow(
            RunWorkflow.run,
            RunInput(run, "tests.example_envs:shell_arithmetic", groups_in_flight=1, max_groups=2),
            id=run_workflow_id(run),
            task_queue=queue,
        )
        assert status.episodes_finished == 4 and status.episodes_failed == 0
        finished = [
            e for e in await events(ledger, run_episodes_stream(run)) if e.kind == Kind.EPISODE_FINISHED
        ]
        assert all(e.payload["rewards"] == {"solver": 1.0} for e in finished), (
            "each episode found its own question"
        )
        epochs = sorted(int(e.payload["sandbox"].rpartition("@")[2]) for e in finished)
        assert len(set(epochs)) == 4, "one sandbox, claimed by one episode at a time, each under a new epoch"
        claimed = await find_lease(ledger, sandbox_lease("shell#episodes-test", "box-0"))
        holder = await live_lease_holder(ledger, sandbox_lease("shell#episodes-test", "box-0"))
        assert claimed is not None and holder is None, "the last episode released its claim"


async def test_an_episode_with_no_sandbox_free_waits_then_fails_saying_why(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    client, queue = runner
    run = f"nobox-{uuid.uuid4().hex[:6]}"
    status = await client.execute_workflow(
        RunWorkflow.run,
        RunInput(run, "tests.example_envs:no_sandbox", groups_in_flight=1, max_groups=1),
        id=run_workflow_id(run),
        task_queue=queue,
    )
    assert status.episodes_failed == 2 and status.episodes_finished == 0
    failed = [e for e in await events(ledger, run_episodes_stream(run)) if e.kind == Kind.EPISODE_ABANDONED]
    assert "no sandbox free after waiting 1s" in failed[0].payload["error"]
    assert "rollout sandbox serve --kind shell#nobody-serves" in failed[0].payload["error"]


async def test_an_external_command_plays_its_seat_and_the_task_scores_it(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    client, queue = runner
    run = f"ext-{uuid.uuid4().hex[:6]}"
    status = await client.execute_workflow(
        RunWorkflow.run,
        RunInput(run, "tests.example_envs:external_arithmetic", max_groups=1),
        id=run_workflow_id(run),
        task_queue=queue,
    )
    assert status.episodes_finished == 2, status
    recorded = await events(ledger, run_episodes_stream(run))
    finished = [e for e in recorded if e.kind == Kind.EPISODE_FINISHED]
    abandoned = [e.payload for e in recorded if e.kind == Kind.EPISODE_ABANDONED]
    for episode in finished:
        assert episode.payload["rewards"] == {"solver": 1.0} and episode.payload["turns"] == {"solver": 2}
        seat = episode.payload["seats"]["solver"]
        # A command's seat is fresh per attempt (it is never replayed): on a loaded machine an attempt may be
        # abandoned, and then each earlier attempt has its own seat, abandoned with its reason on record.
        before, _, attempt = seat.rpartition("/a")
        earlier = [a for a in abandoned if a["episode"] == episode.payload["episode"]]
        assert sorted(a["seat"] for a in earlier) == [f"{before}/a{n}" for n in range(1, int(attempt))], (
            seat,
            earlier,
        )
        assert all(a["reason"] for a in earlier)
        kinds = [e.kind for e in await events(ledger, seat_stream(seat))]
        assert kinds == [Kind.SEAT_OPENED, Kind.TURN_RECORDED, Kind.TURN_RECORDED, Kind.SEAT_CLOSED]


async def test_each_training_step_consumes_whole_groups_once(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    client, queue = runner
    run = f"batch-{uuid.uuid4().hex[:6]}"
    status = await client.execute_workflow(
        RunWorkflow.run,
        RunInput(run, "tests.example_envs:coin", groups_in_flight=2, max_groups=5),
        id=run_workflow_id(run),
        task_queue=queue,
    )
    assert status.episodes_finished == 20

    def step(n: int) -> AssembleInput:
        return AssembleInput(run, run_policy(run, "default"), n, group_size=4, groups_per_batch=2)

    first = await record_batch(ledger, step(1))
    assert first is not None and first.groups == [0, 1] and len(first.episodes) == 8
    assert first.skipped_groups == 0 and first.sampled_tokens > 0 and first.reward_mean == 0.5
    assert await record_batch(ledger, step(1)) == first, "a retried step gets the same batch"
    second = await record_batch(ledger, step(2))
    assert second is not None and second.groups == [2, 3], "no episode is used twice"
    assert await record_batch(ledger, step(3)) is None, (
        "one group of two ready: the step waits for a whole batch"
    )
    batch = await load_batch(ledger, first)
    assert sorted({w.episode for w in batch.segments}) == first.trained_episodes
    assert sorted(w.advantage for w in batch.segments) == pytest.approx([-1.0] * 4 + [1.0] * 4, rel=1e-5)
    recorded = [
        e
        for e in await ledger.read(run_batches_stream(run, run_policy(run, "default")))
        if e.kind == Kind.BATCH_ASSEMBLED
    ]
    assert [e.key for e in recorded] == ["step/1", "step/2"]


@asynccontextmanager
async def fake_trainer(client: Client, ledger: Ledger) -> AsyncIterator[str]:
    """A trainer worker on a queue of its own whose batches are the real ones (`look_for_batch`) and whose
    steps train nothing: each returns a checkpoint name without publishing one (so admission never waits for
    an engine to serve it). Yields its queue."""
    queue = f"trainer-{uuid.uuid4().hex[:8]}"

    @activity.defn(name=trainer_stubs.assemble_batch.__name__)
    async def assemble(given: AssembleInput) -> BatchLookup:
        return await look_for_batch(ledger, given)

    @activity.defn(name=trainer_stubs.train_step.__name__)
    async def train(given: TrainStepInput) -> CheckpointInfo:
        return CheckpointInfo(
            name=f"{given.policy}/step-{given.step}", version=given.step, parent=given.parent
        )

    worker = Worker(
        client,
        task_queue=queue,
        workflows=[TrainingWorkflow, BridgeWorkflow],
        activities=[assemble, train],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    async with worker:
        yield queue


def trains(steps: int, queue: str, *, groups_per_batch: int = 2, refill_max: int | None = 2) -> TrainingSpec:
    return TrainingSpec(
        steps,
        groups_per_batch=groups_per_batch,
        refill=refill_max is not None,
        refill_max=refill_max,
        serve_formats=[],
        wait_s=0.2,
        served_wait_s=0,
        task_queue=queue,
    )


async def batches_of(ledger: Ledger, run: str) -> list[BatchInfo]:
    recorded = await ledger.read(run_batches_stream(run, run_policy(run, "default")))
    return [BatchInfo.from_payload(e.payload) for e in recorded if e.kind == Kind.BATCH_ASSEMBLED]


async def test_refill_trains_full_batches_of_groups_with_signal_within_its_bound(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    """Odd groups always tie: each step replaces them by fresh groups and trains two even groups, also with
    max_lag 0 (the supply starts the replacements: the allowance grows by the groups replaced)."""
    client, queue = runner
    run = f"refill-{uuid.uuid4().hex[:6]}"
    async with fake_trainer(client, ledger) as trainer_queue:
        await client.execute_workflow(
            RunWorkflow.run,
            RunInput(
                run,
                "tests.example_envs:odd_groups_tie",
                groups_in_flight=2,
                settings=RunSettings(max_lag=0),
                training=trains(3, trainer_queue, refill_max=2),
            ),
            id=run_workflow_id(run),
            task_queue=queue,
        )
    batches = await batches_of(ledger, run)
    assert [b.step for b in batches] == [1, 2, 3]
    for batch in batches:
        assert len(batch.groups) == 2 and all(g % 2 == 0 for g in batch.groups), batch
        assert all(g % 2 == 1 for g in batch.replaced_groups) and batch.groups_replaced <= 2, batch
        assert batch.skipped_groups == 0 and batch.sampled_tokens > 0
        assert (batch.groups_drawn, batch.groups_kept) == (len(batch.groups) + batch.groups_replaced, 2)
    consumed = sorted(g for b in batches for g in (*b.groups, *b.replaced_groups))
    assert consumed == list(range(len(consumed))), "every group drawn once, oldest first"
    assert batches[0].reward_mean == pytest.approx((4 * 0.5 + 2 * 4 * 0.5) / 12), "over replaced groups too"
    progress = TrainingProgress(run=run, policy="default")
    await progress.refresh(ledger)
    replaced = sum(b.groups_replaced for b in batches)
    assert progress.groups_replaced == replaced > 0
    assert f"refilled {replaced}" in progress.line()


async def test_refill_where_every_group_ties_draws_its_bound_then_skips_the_step_saying_why(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    client, queue = runner
    run = f"ties-{uuid.uuid4().hex[:6]}"
    async with fake_trainer(client, ledger) as trainer_queue:
        status = await client.execute_workflow(
            RunWorkflow.run,
            RunInput(
                run,
                "tests.example_envs:every_group_ties",
                groups_in_flight=2,
                settings=RunSettings(max_lag=0),
                training=trains(2, trainer_queue, refill_max=2),
            ),
            id=run_workflow_id(run),
            task_queue=queue,
        )
    assert status.trained == {"default": None}, "no step trained: no checkpoint"
    batches = await batches_of(ledger, run)
    assert [(b.groups_drawn, b.groups_replaced, b.sampled_tokens) for b in batches] == [
        (4, 2, 0),
        (4, 2, 0),
    ], "each step drew groups_per_batch + refill_max groups, then was skipped for no signal as without refill"
    progress = TrainingProgress(run=run, policy="default")
    await progress.refresh(ledger)
    said = progress.skipped_reason()
    assert said is not None and "2 of 2 batches were skipped" in said and "no signal" in said
    assert "replaced 4 tied groups" in said


async def test_two_hung_groups_stop_holding_the_supplys_slots_and_training_goes_on(
    runner: tuple[Client, str], ledger: Ledger
) -> None:
    """Groups 3 and 4 hang in `respond` (to its 12 s bound) with two slots: once they run far past the run's
    typical group time they are stragglers, other groups play beside them and train, and each hung episode
    ends at its bound, recorded with its reason."""
    client, queue = runner
    run = f"hang-{uuid.uuid4().hex[:6]}"
    async with fake_trainer(client, ledger) as trainer_queue:
        await client.execute_workflow(
            RunWorkflow.run,
            RunInput(
                run,
                "tests.example_envs:hangs_in_groups_3_and_4",
                groups_in_flight=2,
                settings=RunSettings(max_lag=1),
                max_failure_rate=1.0,
                straggler_floor_s=1.0,
                training=trains(5, trainer_queue, groups_per_batch=1, refill_max=None),
            ),
            id=run_workflow_id(run),
            task_queue=queue,
        )
    events = await ledger.read(run_episodes_stream(run))
    hung = [e for e in events if e.kind == Kind.EPISODE_ABANDONED]
    assert sorted(e.payload["group"] for e in hung) == [3, 3, 4, 4]
    assert all("respond did not return within 12 s" in e.payload["error"] for e in hung)
    recorded = [
        e
        for e in await ledger.read(run_batches_stream(run, run_policy(run, "default")))
        if e.kind == Kind.BATCH_ASSEMBLED
    ]
    assert [BatchInfo.from_payload(e.payload).groups for e in recorded] == [[0], [1], [2], [5], [6]]
    assert recorded[-1].recorded_at < min(e.recorded_at for e in hung), (
        "the last step trained while the hung groups still played"
    )
