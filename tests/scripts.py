"""Scripts for the scripted engine in tests that run it as a process (`--script tests.scripts:play`)."""

from __future__ import annotations

import re

from gridworld.policy import reply_to_prompt
from minecraft_team import policy as minecraft_policy
from rollout.contracts import Message


def play(prompt: str) -> Message:
    """Play whichever example environment the prompt is from: walk gridworlds, build pillars, answer
    arithmetic."""
    if "one of four builders" in prompt:
        return minecraft_policy.reply_to_prompt(prompt)
    if "Map:" in prompt:
        return reply_to_prompt(prompt)
    found = re.findall(r"What is (-?\d+) ([+*-]) (-?\d+)\?", prompt)
    if found:
        a, op, b = found[-1]
        return Message.assistant(str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]))
    return Message.assistant("ok")
