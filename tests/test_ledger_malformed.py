"""Readers that take one event kind across streams pass over a payload no writer of ours made, and read
the rest: the followers' serving requests, the dashboard's steps, episodes and eval results, the registered
suites, the runs' list, and `rollout train`'s live line (checkpoints, batches, engines' acks).
A payload that is no JSON object is refused when it is appended (migration 0011).

Per-kind logins keep most writers off these kinds, but the owner, `rollout_worker` and an older ledger are
not held to them. The events go to a ledger database of this module's own, so the shared one stays clean.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from rollout.config import Settings
from rollout.control.progress import TrainingProgress
from rollout.evals.records import every_result, register, registered_suites, results
from rollout.evals.suites import suite_from_payload
from rollout.ledger import Ledger, NewEvent, migrate
from rollout.ledger.events import Kind
from rollout.ledger.payloads import EpisodeEnded
from rollout.ledger.queries import find_run, list_runs
from rollout.ledger.streams import (
    EVAL_SUITES,
    SERVING_ACKS,
    SERVING_REQUESTS,
    eval_results_stream,
    policy_checkpoints_stream,
    run_batches_stream,
    run_episodes_stream,
    run_stream,
)
from rollout.ledger.views import checkpoint_tree, find_episodes, run_steps
from rollout.records.checkpoints import CheckpointRecord
from rollout.records.evals import EvalResult
from rollout.records.serving import ServingRequest
from rollout.run.settings import BadRunSetting
from rollout.serving.states import ServingRequests
from rollout.training.checkpoints import checkpoint_name
from rollout.workflows.names import run_policy

# What a forger might append: fields missing, of the wrong type, or of another kind's shape.
FORGED: list[dict[str, object]] = [{}, {"holder": 7, "checkpoint": ["x"]}, {"run": None, "suite": 1}]


@pytest.fixture
async def owner(stack_settings: Settings, database: str) -> AsyncIterator[Ledger]:
    async with await Ledger.connect(migrate._with_database(stack_settings.ledger_url, database)) as opened:
        yield opened


async def _forge(ledger: Ledger, stream: str, kind: Kind) -> None:
    await ledger.append(
        stream, [NewEvent(f"forged-{uuid.uuid4().hex[:8]}", kind.value, payload) for payload in FORGED]
    )


async def test_a_follower_reads_the_serving_requests_around_forged_ones(owner: Ledger) -> None:
    await _forge(owner, SERVING_REQUESTS, Kind.SERVING_REQUESTED)
    asked = ServingRequest("eval/one", "p-000003")
    await owner.append_one(
        SERVING_REQUESTS, NewEvent(asked.requested_key, Kind.SERVING_REQUESTED, asked.to_payload())
    )
    await _forge(owner, SERVING_REQUESTS, Kind.SERVING_RELEASED)
    requests = ServingRequests()
    assert await requests.refresh(owner)
    assert requests.wanted() == {"p-000003"}


async def test_the_dashboard_lists_steps_and_episodes_around_forged_ones(owner: Ledger) -> None:
    run = f"forged-{uuid.uuid4().hex[:6]}"
    checkpoints = policy_checkpoints_stream(f"{run}-policy")
    await owner.append(
        checkpoints,
        [
            NewEvent(f"bad-{i}", Kind.CHECKPOINT_CREATED.value, {**p, "run": run})
            for i, p in enumerate(FORGED)
        ],
    )
    step = CheckpointRecord(f"{run}-policy-000001", f"{run}-policy", 1, None, run, {})  # as a trainer writes
    await owner.append_one(checkpoints, NewEvent("good", Kind.CHECKPOINT_CREATED.value, step.to_payload()))
    assert [s.version for s in await run_steps(owner, run)] == [1]
    assert [n.name for n in await checkpoint_tree(owner, run=run)] == [step.name]

    episodes = run_episodes_stream(run)
    await _forge(owner, episodes, Kind.EPISODE_FINISHED)
    await owner.append(
        episodes,
        [
            NewEvent(f"bad-run-{i}", Kind.EPISODE_FINISHED.value, {**p, "run": run})
            for i, p in enumerate(FORGED)
        ],
    )
    ended = EpisodeEnded(run=run, episode="g000000-0", group=0, finished=True, rewards={"solver": 1.0})
    await owner.append_one(episodes, NewEvent(ended.key, Kind.EPISODE_FINISHED.value, ended.to_payload()))
    assert [(e.episode, e.rewards) for e in await find_episodes(owner, run=run)] == [
        ("g000000-0", {"solver": 1.0})
    ]
    assert "g000000-0" in {e.episode for e in await find_episodes(owner)}, (
        "unfiltered, the forged go unlisted"
    )


async def test_suites_and_eval_results_read_around_forged_ones(owner: Ledger) -> None:
    name = f"forged{uuid.uuid4().hex[:6]}"
    await _forge(owner, EVAL_SUITES, Kind.EVAL_SUITE_REGISTERED)
    await owner.append_one(
        EVAL_SUITES,
        NewEvent(
            "odd@1", Kind.EVAL_SUITE_REGISTERED.value, {"suite": {"name": [], "environments": [{"name": []}]}}
        ),
    )
    suite = suite_from_payload({"name": name, "version": "1", "environments": ["tests.example_envs:coin"]})
    assert await register(owner, suite)
    assert [s.ref for s, _ in await registered_suites(owner)] == [suite.ref]

    await _forge(owner, eval_results_stream(name), Kind.EVAL_RESULT)
    scored = EvalResult(
        suite=name,
        version="1",
        suite_hash=suite.content_hash(),
        checkpoint="base",
        checkpoint_version=0,
        policy=None,
        environment=suite.environments[0].name,
        reference="tests.example_envs:coin",
        metric="reward",
        score=0.5,
        low=0.25,
        high=0.75,
        episodes=4,
        failed=0,
        run=f"eval-{name}",
    )
    await owner.append_one(
        eval_results_stream(name), NewEvent(scored.key, Kind.EVAL_RESULT.value, scored.to_payload())
    )
    assert await results(owner, name) == [scored]
    assert await every_result(owner) == [scored]


@pytest.mark.parametrize("payload", [[1, 2], "text", 7, None])
async def test_a_payload_that_is_no_json_object_is_refused(
    stack_settings: Settings, database: str, owner: Ledger, payload: object
) -> None:
    """Straight through the ledger's function, as a client of the database's own would call it (the `Ledger`
    class makes every payload a mapping before it is sent)."""
    stream = f"test/{uuid.uuid4().hex[:8]}"
    url = migrate._with_database(stack_settings.ledger_url, database)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="event_payload_is_an_object"):
            await conn.execute(
                "SELECT * FROM ledger_append(%s, NULL, 0, NULL, %s, %s, %s)",
                (stream, ["not-an-object"], ["Anything"], [Jsonb(payload)]),
            )
    assert await owner.read(stream) == []


async def test_runs_and_a_training_runs_progress_read_around_forged_ones(owner: Ledger) -> None:
    run = f"forged-{uuid.uuid4().hex[:6]}"
    # A run whose recorded settings do not parse is passed over in the list, and refused when named.
    forged = {"run": run, "environment": "e", "settings": {"max_lag": "all of them"}}
    await owner.append_one(run_stream(run), NewEvent("created", Kind.RUN_CREATED.value, forged))
    assert run not in [r.run for r in await list_runs(owner)]
    with pytest.raises(BadRunSetting, match="max_lag"):
        await find_run(owner, run)
    # `rollout train`'s live line reads checkpoints, batches and the engines' acks around forged ones.
    policy = run_policy(run, "default")
    await _forge(owner, policy_checkpoints_stream(policy), Kind.CHECKPOINT_CREATED)
    await _forge(owner, run_batches_stream(run, policy), Kind.BATCH_ASSEMBLED)
    await _forge(owner, SERVING_ACKS, Kind.SERVING_ACK)
    created = CheckpointRecord(
        name=checkpoint_name(policy, 1), policy=policy, version=1, parent=None, run=run, files={}
    )
    await owner.append_one(
        policy_checkpoints_stream(policy),
        NewEvent("step/1", Kind.CHECKPOINT_CREATED.value, created.to_payload()),
    )
    progress = TrainingProgress(run, "default")
    await progress.refresh(owner)
    assert [s.name for s in progress.steps] == [created.name] and progress.batches == 0
