"""Claude Code and Codex train: the real npm CLIs play two seats of the coding environment side by side (each
on its own copy of the task's repository in one shell sandbox), sampling the tiny local model through the
gateway (streamed), for two synchronous training steps. Both seats' sampled tokens are in the trained batches,
checkpoint 1 is served, and the CLIs' later turns sample it.

With random weights the CLIs do nothing useful, so the test environment adds a coin to the reward
(tests.example_envs:coding_clis): groups need rewards that differ to train on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollout.activities.batches import load_batch
from rollout.config import Settings
from rollout.ledger import Kind, Ledger
from rollout.ledger.payloads import SampledTurn, episode_ended, turn_recorded
from rollout.ledger.queries import read_all
from rollout.ledger.streams import run_batches_stream, run_episodes_stream, seat_stream
from rollout.records.batches import BatchInfo
from rollout.run.settings import RunSettings, RunStatus
from rollout.sandbox.hosting import hosted_sandbox
from rollout.sandbox.keys import kind_key
from rollout.workflows.names import run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout.workflows.training_types import TrainingSpec
from tests.sandboxutil import SANDBOX_KEY
from tests.test_agent_clis import cli
from tests.test_training_loop import training_loop

pytestmark = pytest.mark.slow

AGENTS = ("claude-code", "codex")


@pytest.mark.timeout(1200)
async def test_claude_code_and_codex_train_on_the_coding_environment(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODING_CLAUDE", await asyncio.to_thread(cli, "@anthropic-ai/claude-code", "claude"))
    monkeypatch.setenv("CODING_CODEX", await asyncio.to_thread(cli, "@openai/codex", "codex"))
    async with (
        hosted_sandbox(
            ledger,
            "shell#cli-train",
            "box-0",
            seats=2,
            workdir=tmp_path / "box-0",
            key=kind_key(SANDBOX_KEY, "shell#cli-train"),
        ),
        hosted_sandbox(
            ledger,
            "shell#cli-train",
            "box-1",
            seats=2,
            workdir=tmp_path / "box-1",
            key=kind_key(SANDBOX_KEY, "shell#cli-train"),
        ),
        # The CLIs' system prompts and tool lists run to tens of thousands of tokens.
        training_loop(stack_settings, ledger, tiny_qwen3, tmp_path, max_context=65536) as loop,
    ):
        status: RunStatus = await asyncio.wait_for(
            loop.client.execute_workflow(
                RunWorkflow.run,
                RunInput(
                    loop.run,
                    "tests.example_envs:coding_clis",
                    groups_in_flight=1,
                    settings=RunSettings(
                        max_lag=0, max_tokens=16
                    ),  # synchronous: the second group plays only once checkpoint 1 is served
                    training=TrainingSpec(
                        2, groups_per_batch=1, wait_s=0.5, served_wait_s=120, task_queue=loop.trainer_queue
                    ),
                ),
                id=run_workflow_id(loop.run),
                task_queue=loop.queue,
            ),
            1100,
        )
    ((policy, checkpoint),) = status.trained.items()
    assert checkpoint is not None and checkpoint.endswith("step000002"), status
    batches = [
        BatchInfo.from_payload(e.payload)
        for e in await read_all(ledger, run_batches_stream(loop.run, run_policy(loop.run, policy)))
        if e.kind == Kind.BATCH_ASSEMBLED
    ]
    assert len(batches) == 2
    for info in batches:
        batch = await load_batch(ledger, info)
        trained = {w.agent for w in batch.segments if w.segment.sampled_tokens}
        assert trained == set(AGENTS), f"step {info.step} trained on both CLIs' sampled tokens: {trained}"
    records = [r for e in await read_all(ledger, run_episodes_stream(loop.run)) if (r := episode_ended(e))]
    versions: dict[str, set[int]] = {agent: set() for agent in AGENTS}
    for record in records:
        for agent in AGENTS:
            for event in await read_all(ledger, seat_stream(record.seats[agent])):
                turn = turn_recorded(event.payload) if event.kind == Kind.TURN_RECORDED else None
                if isinstance(turn, SampledTurn) and turn.aborted is None:
                    versions[agent].add(turn.checkpoint_version)
    assert all({0, 1} <= sampled for sampled in versions.values()), (
        f"both CLIs sampled the base, then checkpoint 1 once it was served: {versions}"
    )
