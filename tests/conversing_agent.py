"""A command agent for tests that talks the way Claude Code and Codex do: a tool conversation, then a rewrite
of that history (a compaction: the earlier turns summarised), then a side task (a title) asked of another
model name with no tools. Each request goes to its seat over the OpenAI SDK; it prints `done`."""

from __future__ import annotations

import os
import sys

import openai
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

SHELL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
SYSTEM = "You are a coding agent. Use the shell tool."
TITLE_MODEL = "title-model"


def main() -> int:
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY name the seat
    task = os.environ["ROLLOUT_PROMPT"]
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    # The task's conversation (how a conversation extends, tool results and all, is
    # tests/test_agent_clis.py's).
    client.chat.completions.create(model="policy", messages=messages, tools=[SHELL], max_tokens=8)
    # A compaction: the history so far replaced by a summary of it (a new segment, which trains too).
    compacted: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{task}\n\nSummary of the work so far: two attempts, no answer yet."},
    ]
    client.chat.completions.create(model="policy", messages=compacted, tools=[SHELL], max_tokens=8)
    # A side task on the same seat: a title for the session, asked of another model name, without tools.
    title: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Write a five-word title for this conversation."},
        {"role": "user", "content": task},
    ]
    client.chat.completions.create(model=TITLE_MODEL, messages=title, max_tokens=8)
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
