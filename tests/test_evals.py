"""Evals end to end in one process (real Temporal, Postgres, HTTP, the tiny model that samples and trains): a
training run scores every second checkpoint without training on the eval episodes, an eval on the base model,
repeated, records one result, and registering changed content under a version is refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateFailedError

from rollout.config import ConfigError, Settings, load
from rollout.control.evals import eval_input, suite_named
from rollout.evals import EvalEnvironment, Suite, SuiteVersionTaken, UnknownSuite, load_suite
from rollout.evals.gates import decide
from rollout.evals.records import find_suite, record_result, register, results
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import count_events, find_run, read_all, run_turns
from rollout.ledger.streams import (
    SERVING_REQUESTS,
    eval_gates_stream,
    eval_results_stream,
    policy_checkpoints_stream,
    run_batches_stream,
)
from rollout.records.evals import EvalResult, GateDecision
from rollout.records.serving import ServingTarget
from rollout.run.settings import RunStatus
from rollout.serving.states import desired
from rollout.workflows.eval_types import EvalGate, EvalOutcome
from rollout.workflows.evals import EvalWorkflow
from rollout.workflows.names import eval_workflow_id, run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from tests.test_training_loop import Loop, run_input, training_loop


def coin_suite(version: str = "1") -> Suite:
    name = f"coin-{uuid.uuid4().hex[:6]}"
    return Suite(name, version, (EvalEnvironment("tests.example_envs:coin", episodes=3, max_tokens=4),))


@pytest.mark.timeout(600)
async def test_every_second_checkpoint_is_scored_once_and_eval_episodes_never_train(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    suite = coin_suite()
    assert await register(ledger, suite)
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path) as loop:
        given = run_input(loop, 4)
        assert given.training is not None
        given.training = replace(given.training, evaluation=eval_input(suite, ""), eval_every=2)
        status: RunStatus = await asyncio.wait_for(
            loop.client.execute_workflow(
                RunWorkflow.run, given, id=run_workflow_id(loop.run), task_queue=loop.queue
            ),
            420,
        )
        policy = run_policy(loop.run, "default")
        assert status.trained == {"default": f"{policy}-step000004"}
        scored = await results(ledger, suite.name)
        assert sorted(r.checkpoint for r in scored) == [f"{policy}-step000002", f"{policy}-step000004"]
        assert [r.checkpoint_version for r in scored] == [2, 4] and {r.policy for r in scored} == {policy}
        batches = json.dumps(
            [e.payload for e in await read_all(ledger, run_batches_stream(loop.run, policy))]
        )
        for result in scored:
            assert (result.episodes, result.failed, result.score) == (3, 0, 1.0)
            assert result.low <= result.score <= result.high and result.suite_hash == suite.content_hash()
            turns = await run_turns(ledger, result.run)
            assert len(turns) == 3, "one turn per eval episode"
            assert {t.payload["checkpoint"] for t in turns} == {result.checkpoint}, (
                "sampled by what is scored"
            )
            assert {t.payload["seat"] for t in turns} == set(result.seats)
            assert result.run not in batches, "no batch of the training run holds an eval episode"
            run_row = await find_run(ledger, result.run)
            assert run_row is not None and run_row.settings.eval_suite == suite.ref
            assert run_row.settings.temperature == 0.0
        # Each checkpoint was asked for and released.
        requests = [
            e
            for e in await read_all(ledger, SERVING_REQUESTS)
            if e.payload["holder"].startswith(f"eval/{suite.ref}/")
        ]
        assert sorted(e.kind for e in requests) == ["ServingReleased"] * 2 + ["ServingRequested"] * 2

        # The base model, twice: the second eval finds the first one's result and plays nothing.
        base = eval_input(suite, "base")
        first: EvalOutcome = await loop.client.execute_workflow(
            EvalWorkflow.run,
            base,
            id=eval_workflow_id(suite.name, suite.version, "base"),
            task_queue=loop.queue,
        )
        again: EvalOutcome = await loop.client.execute_workflow(
            EvalWorkflow.run,
            base,
            id=eval_workflow_id(suite.name, suite.version, "base"),
            task_queue=loop.queue,
        )
        assert first == again and first.checkpoint == "base" and len(first.scores) == 1
        assert await count_events(ledger, eval_results_stream(suite.name), Kind.EVAL_RESULT) == 3
        (base_result,) = [r for r in await results(ledger, suite.name) if r.checkpoint == "base"]
        assert len(await run_turns(ledger, base_result.run)) == 3, "the repeat played no episode"


async def test_the_suites_temperature_reaches_the_engine(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    """Temperature 0 (the default) is greedy: two suite versions play identical replies on the base model. At
    temperature 1 the random model's replies to the same prompt differ."""
    one = coin_suite("1")
    two = Suite(one.name, "2", one.environments)
    hot = Suite(one.name, "3", (replace(one.environments[0], temperature=1.0),))
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path) as loop:
        replies = []
        for suite in (one, two, hot):
            await register(ledger, suite)
            outcome: EvalOutcome = await loop.client.execute_workflow(
                EvalWorkflow.run,
                eval_input(suite, "base"),
                id=eval_workflow_id(suite.name, suite.version, "base"),
                task_queue=loop.queue,
            )
            turns = await run_turns(ledger, outcome.scores[0].run)
            replies.append(sorted(tuple(t.payload["completion_ids"]) for t in turns))
        assert replies[0] == replies[1] and len(set(replies[0])) == 1, "greedy: one reply to one prompt"
        assert len(set(replies[2])) > 1, "sampled: the replies differ"


async def test_an_sft_checkpoint_is_made_servable_and_scored(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    """A warm start has no serving target: the eval bridges it on the trainer queue, then scores it."""
    from rollout.blobs import FileBlobStore
    from rollout.control.warm_start import warm_start
    from rollout.ledger.queries import serving_target_formats
    from rollout.training.sft import SftConfig

    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {a} + 1?"}],
            "completion": [{"role": "assistant", "content": str(a + 1)}],
        }
        for a in range(4)
    ]
    record = await warm_start(
        ledger,
        FileBlobStore(tmp_path / "blobs"),
        name=f"eval-{uuid.uuid4().hex[:6]}",
        model_path=tiny_qwen3,
        rows=rows,
        config=SftConfig(lora_rank=4, lora_alpha=8, learning_rate=5e-3, epochs=1, batch_size=4),
        holder="eval-test",
        scratch=tmp_path,
    )
    assert await serving_target_formats(ledger, record.name) == []
    suite = coin_suite()
    await register(ledger, suite)
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path, follow_all=True) as loop:
        given = replace(eval_input(suite, record.name), bridge_queue=loop.trainer_queue)
        outcome: EvalOutcome = await asyncio.wait_for(
            loop.client.execute_workflow(
                EvalWorkflow.run,
                given,
                id=eval_workflow_id(suite.name, suite.version, record.name),
                task_queue=loop.queue,
            ),
            300,
        )
    assert outcome.checkpoint == record.name and outcome.scores[0].episodes == 3
    assert await serving_target_formats(ledger, record.name) == ["lora"]
    turns = await run_turns(ledger, outcome.scores[0].run)
    assert {t.payload["checkpoint"] for t in turns} == {record.name}, "the adapter sampled every eval turn"


async def test_changed_content_under_a_registered_version_is_refused(ledger: Ledger) -> None:
    suite = coin_suite()
    assert await register(ledger, suite) is True
    assert await register(ledger, suite) is False, "the same content again changes nothing"
    changed = Suite(suite.name, suite.version, (replace(suite.environments[0], episodes=4),))
    with pytest.raises(SuiteVersionTaken, match="bump its version"):
        await register(ledger, changed)
    bumped = Suite(suite.name, "2", changed.environments)
    assert await register(ledger, bumped)
    assert await find_suite(ledger, suite.name) == bumped, "the newest version by default"
    assert await find_suite(ledger, suite.name, "1") == suite
    with pytest.raises(UnknownSuite, match="registered versions are 1, 2"):
        await find_suite(ledger, suite.name, "3")
    with pytest.raises(UnknownSuite, match="rollout eval register"):
        await find_suite(ledger, "no-such-suite")


async def test_a_newly_shipped_suite_version_becomes_the_newest(ledger: Ledger) -> None:
    shipped = load_suite("smoke")
    older = Suite("smoke", "1", tuple(replace(e, max_tokens=None) for e in shipped.environments))
    assert shipped.version == "2" and older.content_hash() != shipped.content_hash()
    assert await register(ledger, older), "what a ledger from the release before holds"
    assert await suite_named(ledger, "smoke") == shipped, (
        "the shipped version is registered and is the newest"
    )
    assert await find_suite(ledger, "smoke", "1") != shipped


def test_engines_keep_serving_a_requested_older_checkpoint() -> None:
    targets = [ServingTarget("r/p", f"r/p-step{v:06d}", v, "r", "lora") for v in range(1, 6)]
    newest = [t.version for t in desired(targets, ("lora",), keep=2)]
    assert newest == [5, 4]
    kept = desired(targets, ("lora",), keep=2, requested=frozenset({"r/p-step000002"}))
    assert [t.version for t in kept] == [5, 4, 2]


async def _scored(ledger: Ledger, suite: Suite, policy: str, version: int, score: float) -> None:
    """Record that checkpoint `version` of the lineage scored `score` on the suite's one environment."""
    (environment,) = suite.environments
    result = EvalResult(
        suite=suite.name,
        version=suite.version,
        suite_hash=suite.content_hash(),
        checkpoint=f"{policy}-step{version:06d}",
        checkpoint_version=version,
        policy=policy,
        environment=environment.name or "coin",
        reference=environment.environment,
        metric="mean_reward",
        score=score,
        low=score,
        high=score,
        episodes=3,
        failed=0,
        run="arranged",
    )
    await record_result(ledger, result)


async def _arranged_best(ledger: Ledger, suite: Suite, policy: str) -> None:
    """Checkpoint 1 of the lineage already scored 2.0 (the coin scores 1.0): the next eval drops by 1.0."""
    await _scored(ledger, suite, policy, 1, 2.0)


def _gated(loop: Loop, suite: Suite, steps: int, action: str) -> RunInput:
    """A synchronous run of `steps` steps, every 2nd checkpoint scored on `suite`, gate: a drop of 0.5."""
    given = run_input(loop, steps, max_lag=0)
    assert given.training is not None
    gated = replace(eval_input(suite, ""), gate=EvalGate(max_drop=0.5, action=action))
    given.training = replace(given.training, evaluation=gated, eval_every=2)
    return given


@pytest.mark.timeout(600)
async def test_a_gate_pauses_a_run_whose_score_dropped_once_and_a_rollback_branches_the_tree(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    suite = coin_suite()
    assert await register(ledger, suite)
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path / "pause") as loop:
        policy = run_policy(loop.run, "default")
        await _arranged_best(ledger, suite, policy)
        given = _gated(loop, suite, 3, "pause")
        handle = await loop.client.start_workflow(
            RunWorkflow.run, given, id=run_workflow_id(loop.run), task_queue=loop.queue
        )
        status: RunStatus = await handle.query(RunWorkflow.status)
        for _ in range(600):
            if status.paused:
                break
            await asyncio.sleep(0.2)
            status = await handle.query(RunWorkflow.status)
        assert status.paused and status.pause_reason is not None, status
        assert f"{policy}-step000002" in status.pause_reason and f"{policy}-step000001" in status.pause_reason
        assert "eval.gate.max_drop is 0.5" in status.pause_reason
        (decided,) = [e for e in await read_all(ledger, eval_gates_stream(suite.name))]
        assert decided.key == f"{suite.version}/{policy}-step000002" and decided.payload["tripped"] is True

        # Resumed, it finishes (unless its last group was already playing: then it finished paused).
        with contextlib.suppress(WorkflowUpdateFailedError):
            await handle.execute_update(RunWorkflow.resume)
        done: RunStatus = await asyncio.wait_for(handle.result(), 300)
        assert done.trained == {"default": f"{policy}-step000003"}

    rollback_suite = coin_suite()
    assert await register(ledger, rollback_suite)
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path / "rollback") as loop:
        policy = run_policy(loop.run, "default")
        await _arranged_best(ledger, rollback_suite, policy)
        given = _gated(loop, rollback_suite, 5, "rollback")
        await asyncio.wait_for(
            loop.client.execute_workflow(
                RunWorkflow.run, given, id=run_workflow_id(loop.run), task_queue=loop.queue
            ),
            420,
        )
        created = [
            e.payload
            for e in await read_all(ledger, policy_checkpoints_stream(policy))
            if e.kind == Kind.CHECKPOINT_CREATED
        ]
        parents = {c["version"]: c["parent"] for c in created}
        branched = [v for v, parent in parents.items() if v > 2 and parent == f"{policy}-step000001"]
        assert branched, f"a step after the gate tripped trained from the best checkpoint: {parents}"


async def test_a_gate_decides_once_and_only_the_eval_that_decided_acts(ledger: Ledger) -> None:
    suite = coin_suite()
    policy = f"gate-{uuid.uuid4().hex[:6]}/default"
    await _arranged_best(ledger, suite, policy)
    for version, score in ((2, 1.9), (3, 1.2)):
        await _scored(ledger, suite, policy, version, score)

    async def gate(checkpoint: str, decided_by: str) -> tuple[GateDecision, bool]:
        return await decide(
            ledger,
            suite=suite.name,
            version=suite.version,
            checkpoint=f"{policy}-{checkpoint}",
            lineage=policy,
            max_drop=0.5,
            action="rollback",
            decided_by=decided_by,
        )

    small, acts = await gate("step000002", "eval-a")
    assert not small.tripped and acts, "a drop of 0.1 is within max_drop"
    dropped, acts = await gate("step000003", "eval-b")
    assert dropped.tripped and acts and dropped.best == f"{policy}-step000001"
    assert "0.800 below the best before it (2.000" in dropped.reason
    retried, acts = await gate("step000003", "eval-b")
    assert retried == dropped and acts, "a retried activity of the same eval acts (it recorded the decision)"
    repeated, acts = await gate("step000003", "eval-c")
    assert repeated == dropped and not acts, "a repeated eval of the checkpoint finds the decision: no act"
    assert len(await read_all(ledger, eval_gates_stream(suite.name))) == 2

    # Bad input, before any run starts: one line naming the setting.
    evaluated = ["eval.suite=smoke", "eval.every=2"]
    with pytest.raises(
        ConfigError, match=r"^bad value for 'eval\.gate\.max_drop': it gates a suite the run does"
    ):
        load(["eval.gate.max_drop=0.1"])
    with pytest.raises(ConfigError, match=r"'eval\.gate\.max_drop': -1\.0 is not a drop"):
        load([*evaluated, "eval.gate.max_drop=-1"])
    with pytest.raises(ConfigError, match=r"'eval\.gate\.action': Invalid value 'explode'"):
        load([*evaluated, "eval.gate.max_drop=0.1", "eval.gate.action=explode"])
