"""Claude Code and Codex, unchanged, solve a coding task as command agents: the runner's external loop starts
after the Task's `prepare` laid the repository out, its model turns go through a real gateway (the engine is
scripted: it asks the CLI's shell tool to write the reference solution, then says it is done), and the Task
grades the repository back in a real shell sandbox. The CLIs are the real npm packages, installed once into a
cache."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path

import pytest

from coding.environment import claude_code, codex
from coding.solver import write_files_command
from coding.tasks import task_named
from rollout.activities.external_loop import play_external
from rollout.contracts import Message, ToolCall
from rollout.engines.models import npm_package_dir
from rollout.engines.scripted import ScriptedEngine
from rollout.environment import Environment
from rollout.gateway.seats import load_secret, open_seat
from rollout.harness import RunContext
from rollout.ledger import Ledger
from rollout.rendering import ModelRenderer
from tests.gatewayutil import serve_gateway
from tests.test_coding_env import served_sandbox

pytestmark = pytest.mark.slow

NPM_CACHE = Path.home() / ".cache" / "rollout-tests" / "npm"
TASK = "leap-year"


class WritesTheSolution:
    """Ask for one shell command (with whichever shell tool the CLI offers) writing the reference solution."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> Message:
        self.prompts.append(prompt)
        if re.search(r"<tool_response>", prompt):
            return Message.assistant("I fixed is_leap; done.")
        command = write_files_command(task_named(TASK).solution)
        if '"name": "Bash"' in prompt:
            arguments = {"command": command, "description": "Write the fix"}
            return Message.assistant(
                "", tool_calls=(ToolCall(id="toolu_01", name="Bash", arguments=json.dumps(arguments)),)
            )
        if '"name": "exec_command"' in prompt:
            call = ToolCall(id="call_01", name="exec_command", arguments=json.dumps({"cmd": command}))
            return Message.assistant("", tool_calls=(call,))
        return Message.assistant("I have no shell tool.")


def cli(package: str, name: str) -> str:
    return str(npm_package_dir(package, NPM_CACHE).parent.parent / ".bin" / name)


async def solve_with(
    environment: Environment, agent: str, ledger: Ledger, renderer: ModelRenderer, tmp_path: Path
) -> tuple[float, dict[str, float], WritesTheSolution]:
    script = WritesTheSolution()
    seat_id = f"coding-{agent}-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent=agent)
    seat = environment.agent("solver")
    engine = ScriptedEngine(renderer, script)
    async with (
        serve_gateway(ledger, renderer, engine, max_context=262144) as gateway,
        served_sandbox(tmp_path / "box") as sandbox,
    ):
        context = RunContext(
            run="coding-agents", episode=seat_id, seat=seat_id, sandbox=await sandbox.claim()
        )

        async def turns() -> int:
            return engine.calls

        played = await play_external(
            environment.make_task({"task": TASK}, "solver"),  # the seat's flavour: how its CLI is set up
            context,
            seat.command,
            base_url=gateway.url,
            token=token,
            timeout_s=240,
            count_turns=turns,
        )
    return played.reward, played.metrics, script


async def test_claude_code_solves_a_coding_task(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Path
) -> None:
    claude = await asyncio.to_thread(cli, "@anthropic-ai/claude-code", "claude")
    reward, metrics, script = await solve_with(claude_code(claude), "claude-code", ledger, renderer, tmp_path)
    assert any("<tool_response>" in prompt for prompt in script.prompts), "Claude Code ran the shell command"
    assert reward == 1.0 and metrics["tests_passed"] == metrics["tests_total"] == 5, metrics
    assert metrics["turns"] >= 2


async def test_codex_solves_a_coding_task(ledger: Ledger, renderer: ModelRenderer, tmp_path: Path) -> None:
    binary = await asyncio.to_thread(cli, "@openai/codex", "codex")
    reward, metrics, script = await solve_with(codex(binary), "codex", ledger, renderer, tmp_path)
    assert any("<tool_response>" in prompt for prompt in script.prompts), "Codex ran the shell command"
    assert reward == 1.0 and metrics["tests_passed"] == metrics["tests_total"] == 5, metrics
    assert metrics["turns"] >= 2
