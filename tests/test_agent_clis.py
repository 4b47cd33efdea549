"""Claude Code and Codex, unchanged, through the gateway: a tool loop is one segment; what else they send.

The engine is scripted: it asks for the CLI's shell tool, then answers with what the tool printed. The CLIs
are the real npm packages, installed once into a cache directory. Beyond the tool loop: parallel tool calls, a
tool output the client truncates, a Claude Code sub-agent, and compaction (Claude Code's `/compact`, Codex's
automatic one), each recorded as the conversations an environment's `trains` chooses from.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from coding.agents import codex_config
from coding.conversations import COMPACTION_MARKS, SUB_AGENT_MARK, side_request, task_only
from rollout.activities.conversations import conversations, untrained
from rollout.contracts import Message, ToolCall
from rollout.engines.models import npm_package_dir
from rollout.engines.scripted import ScriptedEngine
from rollout.environment import Conversation, Dataset, Environment
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Kind, Ledger
from rollout.ledger.payloads import turn_recorded
from rollout.ledger.streams import seat_stream
from rollout.rendering import ModelRenderer
from tests.example_envs import Coin
from tests.gatewayutil import serve_gateway

pytestmark = pytest.mark.slow

NPM_CACHE = Path.home() / ".cache" / "rollout-tests" / "npm"
MARKER = "rollout-ok-7"


class ShellScript:
    """Ask for one shell command with whichever shell tool the CLI offers; then report its output."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> Message:
        self.prompts.append(prompt)
        result = re.search(r"<tool_response>(.*?)</tool_response>", prompt, re.DOTALL)
        if result:
            return Message.assistant(
                f"The command printed {MARKER}." if MARKER in result.group(1) else "It failed."
            )
        if '"name": "Bash"' in prompt:
            arguments = {"command": f"echo {MARKER}", "description": "Print a marker"}
            return Message.assistant(
                "", tool_calls=(ToolCall(id="toolu_01", name="Bash", arguments=json.dumps(arguments)),)
            )
        if '"name": "exec_command"' in prompt:
            arguments = {"cmd": f"echo {MARKER}"}
            return Message.assistant(
                "", tool_calls=(ToolCall(id="call_01", name="exec_command", arguments=json.dumps(arguments)),)
            )
        return Message.assistant("ok")


def cli(package: str, name: str) -> str:
    return str(npm_package_dir(package, NPM_CACHE).parent.parent / ".bin" / name)


def claude_code_env(gateway_url: str, token: str, home: Path) -> dict[str, str]:
    """Claude Code pointed at a seat, with nothing sent elsewhere."""
    return {
        "ANTHROPIC_BASE_URL": f"{gateway_url}/s/{token}",
        "ANTHROPIC_API_KEY": token,
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def codex_env(gateway_url: str, token: str, home: Path) -> dict[str, str]:
    """Codex pointed at a seat through a provider of its own (Responses dialect), configured in CODEX_HOME."""
    codex_home = home / "codex-home"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(f"{gateway_url}/s/{token}/v1"))
    return {"CODEX_HOME": str(codex_home), "ROLLOUT_API_KEY": token, "HOME": str(home)}


async def run(command: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    return process.returncode or 0, output.decode(errors="replace")


async def recorded_turns(ledger: Ledger, seat_id: str) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in await ledger.read(seat_stream(seat_id)) if e.kind == Kind.TURN_RECORDED]


def assert_one_extended_segment(records: list[dict[str, Any]]) -> None:
    assert len(records) >= 2
    tool_turn, answer = records[-2], records[-1]
    assert tool_turn["reply"]["tool_calls"], "the first turn asked for the shell tool"
    assert answer["segment_id"] == tool_turn["segment_id"], "the answer extends the tool call's segment"
    assert answer["prompt_prefix_len"] >= len(tool_turn["completion_ids"]) > 0
    assert all(len(r["completion_ids"]) == len(r["completion_logprobs"]) for r in records)


async def test_claude_code_completes_a_tool_loop(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Path
) -> None:
    claude = await asyncio.to_thread(cli, "@anthropic-ai/claude-code", "claude")
    script = ShellScript()
    seat_id = f"claude-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent="claude-code")
    async with serve_gateway(
        ledger, renderer, ScriptedEngine(renderer, script), max_context=262144
    ) as gateway:
        env = claude_code_env(gateway.url, token, tmp_path)
        code, output = await run(
            [
                claude,
                "-p",
                f"Run echo {MARKER} with Bash and tell me what it printed.",
                "--allowedTools",
                "Bash",
            ],
            env,
            tmp_path,
        )
    assert code == 0, output
    assert f"The command printed {MARKER}." in output
    assert any(MARKER in p and "<tool_response>" in p for p in script.prompts), "Claude Code ran the command"
    assert_one_extended_segment(await recorded_turns(ledger, seat_id))


async def test_codex_completes_a_tool_loop(ledger: Ledger, renderer: ModelRenderer, tmp_path: Path) -> None:
    codex = await asyncio.to_thread(cli, "@openai/codex", "codex")
    script = ShellScript()
    seat_id = f"codex-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent="codex")
    async with serve_gateway(
        ledger, renderer, ScriptedEngine(renderer, script), max_context=262144
    ) as gateway:
        env = codex_env(gateway.url, token, tmp_path)
        code, output = await run(
            [
                codex,
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                f"Run echo {MARKER} and tell me what it printed.",
            ],
            env,
            tmp_path,
        )
    assert code == 0, output
    assert f"The command printed {MARKER}." in output
    assert any(MARKER in p and "<tool_response>" in p for p in script.prompts), "Codex ran the command"
    assert_one_extended_segment(await recorded_turns(ledger, seat_id))


class TwoCommandsAtOnce:
    """Ask for two shell commands in one reply (parallel tool calls); then report what both printed."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> Message:
        self.prompts.append(prompt)
        results = re.findall(r"<tool_response>(.*?)</tool_response>", prompt, re.DOTALL)
        if results:
            seen = all(any(f"{MARKER}-{n}" in r for r in results) for n in (1, 2))
            return Message.assistant("Both printed their markers." if seen else "Something is missing.")
        if '"name": "Bash"' in prompt:
            name, key, extra = "Bash", "command", {"description": "Print a marker"}
        elif '"name": "exec_command"' in prompt:
            name, key, extra = "exec_command", "cmd", {}
        else:
            return Message.assistant("ok")
        calls = tuple(
            ToolCall(id=f"call_0{n}", name=name, arguments=json.dumps({key: f"echo {MARKER}-{n}", **extra}))
            for n in (1, 2)
        )
        return Message.assistant("", tool_calls=calls)


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
async def test_parallel_tool_calls_are_answered_together_and_extend_the_segment(
    agent: str, ledger: Ledger, renderer: ModelRenderer, tmp_path: Path
) -> None:
    script = TwoCommandsAtOnce()
    seat_id = f"{agent}-parallel-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent=agent)
    async with serve_gateway(
        ledger, renderer, ScriptedEngine(renderer, script), max_context=262144
    ) as gateway:
        if agent == "claude-code":
            claude = await asyncio.to_thread(cli, "@anthropic-ai/claude-code", "claude")
            env = claude_code_env(gateway.url, token, tmp_path)
            command = [claude, "-p", "Print both markers with Bash at once.", "--allowedTools", "Bash"]
        else:
            codex = await asyncio.to_thread(cli, "@openai/codex", "codex")
            env = codex_env(gateway.url, token, tmp_path)
            command = [
                codex,
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "Print both markers at once.",
            ]
        code, output = await run(command, env, tmp_path)
    assert code == 0, output
    assert "Both printed their markers." in output, output[-2000:]
    records = await recorded_turns(ledger, seat_id)
    assert len(records[-2]["reply"]["tool_calls"]) == 2, "one reply with two tool calls"
    assert_one_extended_segment(records)


SHELL_OUTPUT = "seq 1 20000"  # about 109 kB: more than either CLI passes on to the model


def tool_results(prompt: str) -> list[str]:
    return re.findall(r"<tool_response>(.*?)</tool_response>", prompt, re.DOTALL)


def last_user_message(prompt: str) -> str:
    return prompt.rsplit("<|im_start|>user", 1)[-1]


class ClaudeCodeSideRequests:
    """A long shell output, then a sub-agent through the Agent tool, then an answer; a summary when asked to
    compact, and an answer from the summary after it."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> Message:
        self.prompts.append(prompt)
        if any(mark in last_user_message(prompt) for mark in COMPACTION_MARKS):
            return Message.assistant(
                "<analysis>done</analysis>\n<summary>SUMMARY-7: numbers printed.</summary>"
            )
        if SUB_AGENT_MARK in prompt:
            return Message.assistant("The sub-agent says 42.")
        if "SUMMARY-7" in prompt:
            return Message.assistant("Carrying on from the summary.")
        results = tool_results(prompt)
        if not results:
            arguments = {"command": SHELL_OUTPUT, "description": "Print numbers"}
            return Message.assistant(
                "", tool_calls=(ToolCall(id="toolu_01", name="Bash", arguments=json.dumps(arguments)),)
            )
        if len(results) == 1:
            arguments = {
                "description": "Ask a helper",
                "prompt": "Say 42.",
                "subagent_type": "general-purpose",
            }
            return Message.assistant(
                "", tool_calls=(ToolCall(id="toolu_02", name="Agent", arguments=json.dumps(arguments)),)
            )
        return Message.assistant("Done: the sub-agent said 42.")


async def seat_conversations(ledger: Ledger, seat_id: str) -> tuple[list[Conversation], list[str]]:
    """The seat's conversations, and the segments `task_only` keeps out of training."""
    turns = [turn_recorded(record) for record in await recorded_turns(ledger, seat_id)]
    environment = Environment("cli", lambda parameters, agent: Coin(), Dataset([{}]), trains=task_only)
    return conversations(turns), untrained(environment, turns)


def assert_truncated_by_the_client(prompts: list[str]) -> None:
    shown = [r for p in prompts for r in tool_results(p) if "\n19000\n" in r or "\n1\n2\n3\n" in r]
    assert shown, "the shell output reached the model"
    assert all(len(r) < 40_000 for r in shown), "the client shortened the output before sending it"


async def test_claude_code_truncation_sub_agent_and_compaction(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Path
) -> None:
    claude = await asyncio.to_thread(cli, "@anthropic-ai/claude-code", "claude")
    script = ClaudeCodeSideRequests()
    seat_id = f"claude-side-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent="claude-code")
    async with serve_gateway(
        ledger, renderer, ScriptedEngine(renderer, script), max_context=262144
    ) as gateway:
        env = claude_code_env(gateway.url, token, tmp_path)
        outputs = []
        for arguments in (
            ["Print the numbers with Bash, then ask a sub-agent.", "--allowedTools", "Bash,Agent"],
            ["--continue", "/compact"],
            ["--continue", "And now?"],
        ):
            code, output = await run([claude, "-p", *arguments], env, tmp_path)
            assert code == 0, output
            outputs.append(output)
    assert "Done: the sub-agent said 42." in outputs[0] and "Carrying on from the summary." in outputs[2]
    assert_truncated_by_the_client(script.prompts)

    found, kept_out = await seat_conversations(ledger, seat_id)
    kinds = [side_request(c) for c in found]
    task, sub_agent = found[0], found[kinds.index("sub-agent")]
    assert kinds[0] is None and task.turns == 3, (
        "shell call, truncated result, Agent call, answer: one segment"
    )
    assert sub_agent.turns == 1 and "Say 42." in sub_agent.first_user, (
        "the sub-agent is a conversation of its own"
    )
    # Qwen3's template drops earlier replies' think blocks once a user message follows, so the request to
    # compact cannot extend the task's tokens: it is a conversation of its own, marked by its last user
    # message.
    assert kinds.count("compaction") == 1
    after = [c for c, kind in zip(found, kinds, strict=True) if kind is None and "SUMMARY-7" in c.first_user]
    assert len(after) == 1, "the conversation goes on from the summary, a rewrite that trains"
    assert sorted(kept_out) == sorted(c.segment_id for c, kind in zip(found, kinds, strict=True) if kind)


class CodexCompaction:
    """Two long shell outputs (Codex compacts automatically past its token limit), a summary when asked for
    one, and an answer from it."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> Message:
        self.prompts.append(prompt)
        if any(mark in last_user_message(prompt) for mark in COMPACTION_MARKS):
            return Message.assistant("SUMMARY-7: numbers printed twice.")
        if "SUMMARY-7" in prompt:
            return Message.assistant("Done from the summary.")
        results = tool_results(prompt)
        if len(results) < 2:
            arguments = {"cmd": SHELL_OUTPUT}
            return Message.assistant(
                "",
                tool_calls=(
                    ToolCall(
                        id=f"call_0{len(results)}", name="exec_command", arguments=json.dumps(arguments)
                    ),
                ),
            )
        return Message.assistant("Done without compacting.")


async def test_codex_truncation_and_automatic_compaction(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Path
) -> None:
    codex = await asyncio.to_thread(cli, "@openai/codex", "codex")
    script = CodexCompaction()
    seat_id = f"codex-compact-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent="codex")
    async with serve_gateway(
        ledger, renderer, ScriptedEngine(renderer, script), max_context=262144
    ) as gateway:
        env = codex_env(gateway.url, token, tmp_path)
        config = Path(env["CODEX_HOME"]) / "config.toml"
        # Codex's own setting: compact once the context passes 9,000 tokens (its prompt alone is about 7,000).
        config.write_text("model_auto_compact_token_limit = 9000\n" + config.read_text())
        code, output = await run(
            [
                codex,
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "Print the numbers twice.",
            ],
            env,
            tmp_path,
        )
    assert code == 0, output
    assert "Done from the summary." in output, output[-2000:]
    assert_truncated_by_the_client(script.prompts)

    found, kept_out = await seat_conversations(ledger, seat_id)
    kinds = [side_request(c) for c in found]
    assert kinds[0] is None and found[0].turns == 2, (
        "the second shell call extends the truncated result's segment"
    )
    compaction = [c.segment_id for c, kind in zip(found, kinds, strict=True) if kind == "compaction"]
    assert len(compaction) == 1 and kept_out == compaction
    after = [c for c, kind in zip(found, kinds, strict=True) if kind is None and "SUMMARY-7" in c.last_user]
    assert len(after) == 1, "the conversation goes on from the summary, a rewrite that trains"
