"""Command agents train: a seat played by a command (here a script that talks like Claude Code and Codex: a
tool conversation, a compaction of it, a title on the side) trains its policy like a built-in seat. Each of
its conversations is a segment; the rewrite trains, the side task its environment declines does not. A seat
the environment gives to an external model (LiteLLM; here a local OpenAI-compatible server) is answered by it
in the run, recorded as text, and trains nothing.

The real CLIs training on the coding environment are in tests/test_agent_clis_training.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import uvicorn

from benchmarks.scripted_backend import REPLY, build
from rollout.activities.batches import load_batch
from rollout.config import Settings
from rollout.ledger import Kind, Ledger
from rollout.ledger.payloads import ExternalTurn, SampledTurn, episode_ended, turn_recorded
from rollout.ledger.queries import find_run, read_all
from rollout.ledger.streams import run_batches_stream, run_episodes_stream, seat_stream
from rollout.net import free_port
from rollout.records.batches import BatchInfo
from rollout.run.settings import RunSettings, RunStatus
from rollout.workflows.names import run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout.workflows.training_types import TrainingSpec
from tests.test_training_loop import training_loop

pytestmark = pytest.mark.slow


async def seat_turns(ledger: Ledger, seat: str) -> list[SampledTurn | ExternalTurn]:
    return [
        turn_recorded(e.payload)
        for e in await read_all(ledger, seat_stream(seat))
        if e.kind == Kind.TURN_RECORDED
    ]


@pytest.mark.timeout(600)
async def test_a_command_agent_trains_its_rewritten_history_not_its_side_task_and_the_judge_never(
    stack_settings: Settings,
    ledger: Ledger,
    tiny_qwen3: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    backend = uvicorn.Server(
        uvicorn.Config(build([1, 2, 3]), host="127.0.0.1", port=port, log_level="warning")
    )
    serving_backend = asyncio.create_task(backend.serve())
    judge_base = f"http://127.0.0.1:{port}/v1"
    monkeypatch.setenv("ROLLOUT_TEST_JUDGE_API_BASE", judge_base)
    try:
        async with training_loop(
            stack_settings, ledger, tiny_qwen3, tmp_path, external_api_bases=[judge_base]
        ) as loop:
            status: RunStatus = await asyncio.wait_for(
                loop.client.execute_workflow(
                    RunWorkflow.run,
                    RunInput(
                        loop.run,
                        "tests.example_envs:conversing_judged",
                        groups_in_flight=1,
                        settings=RunSettings(max_tokens=8),
                        training=TrainingSpec(
                            1, groups_per_batch=1, wait_s=0.2, served_wait_s=60, task_queue=loop.trainer_queue
                        ),
                    ),
                    id=run_workflow_id(loop.run),
                    task_queue=loop.queue,
                ),
                480,
            )
    finally:
        backend.should_exit = True
        await serving_backend
    ((policy, checkpoint),) = status.trained.items()
    assert policy == "default", "the command agent's policy trains; no training starts for the judge's"
    assert checkpoint is not None and checkpoint.endswith("step000001")
    run = await find_run(ledger, loop.run)
    assert run is not None and run.settings.external_models["judge"].startswith("openai/judge-model@http://")
    (assembled,) = [
        BatchInfo.from_payload(e.payload)
        for e in await read_all(ledger, run_batches_stream(loop.run, run_policy(loop.run, policy)))
        if e.kind == Kind.BATCH_ASSEMBLED
    ]
    batch = await load_batch(ledger, assembled)
    trained = {w.segment.segment_id for w in batch.segments}
    records = [r for e in await read_all(ledger, run_episodes_stream(loop.run)) if (r := episode_ended(e))]
    for record in (r for r in records if r.episode in assembled.episodes):
        (judged,) = await seat_turns(ledger, record.seats["judge"])
        assert isinstance(judged, ExternalTurn) and judged.reply["text"] == REPLY, "the judge is the model"
        turns = [t for t in await seat_turns(ledger, record.seats["solver"]) if isinstance(t, SampledTurn)]
        segments: dict[str, list[SampledTurn]] = {}
        for turn in turns:
            segments.setdefault(turn.segment_id, []).append(turn)
        assert len(segments) == 3, [[t.n_messages for t in ts] for ts in segments.values()]
        task, compaction, title = segments.values()
        assert task[0].opening and task[0].opening["tools"] == ["shell"]
        assert title[0].opening and title[0].opening["model"] == "title-model"
        assert record.untrained == {"solver": [title[0].segment_id]}, "the environment declined the title"
        assert task[0].segment_id in trained and compaction[0].segment_id in trained, (
            "the conversation and its rewrite both train"
        )
        assert title[0].segment_id not in trained
        assert all(t.policy == run_policy(loop.run, "default") for t in turns)
