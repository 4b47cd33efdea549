"""A scripted solver for `rollout env check` and tests: it knows every task's reference solution.

Turn 1 writes the solution's files with one shell call (a heredoc per file), turn 2 runs the visible tests,
turn 3 replies without a tool call, which hands the repository in for grading.
"""

from __future__ import annotations

import json
import shlex

from coding.tasks import CodingTask, coding_tasks
from rollout.contracts import Message, ToolCall, ToolSpec

HEREDOC_END = "ROLLOUT_CODING_EOF"


def write_files_command(files: dict[str, str]) -> str:
    """One bash command that writes `files` (path -> text) with heredocs, making their folders."""
    lines = []
    for path, text in sorted(files.items()):
        if HEREDOC_END in text:
            raise ValueError(f"{path} contains the heredoc terminator {HEREDOC_END}")
        body = text if text.endswith("\n") or not text else text + "\n"
        lines.append(
            f"mkdir -p \"$(dirname {shlex.quote(path)})\" && cat > {shlex.quote(path)} <<'{HEREDOC_END}'"
        )
        lines.append(f"{body}{HEREDOC_END}")
    return "\n".join(lines) + "\n"


def task_in(messages: list[Message]) -> CodingTask | None:
    text = "\n".join(message.text for message in messages if message.role == "user")
    return next((task for task in coding_tasks() if task.instruction in text), None)


def _shell(turn: int, command: str) -> Message:
    call = ToolCall(id=f"call_{turn}", name="shell", arguments=json.dumps({"command": command}))
    return Message.assistant("", tool_calls=(call,))


def solve(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    task = task_in(messages)
    if task is None:
        return Message.assistant("I do not know this task.")
    turn = sum(1 for message in messages if message.role == "assistant")
    if turn == 0:
        return _shell(turn, write_files_command(task.solution))
    if turn == 1:
        return _shell(turn, "python3 -m unittest 2>&1 | tail -n 3")
    return Message.assistant("Done: the fix is in and the visible tests pass.")
