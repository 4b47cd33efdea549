"""The scripted gridworld player: reads the map and positions from the conversation's text, moves along a
shortest path (around the other agents). It works on the rendered prompt too, so the scripted engine can play
it through the gateway (`gridworld.policy:reply_to_prompt`)."""

from __future__ import annotations

import json
import re

from gridworld import Layout, shortest_step
from rollout.contracts import Message, ToolCall, ToolSpec

_MAP = re.compile(r"Map:\n((?:[#.A-Z]+\n?)+)")
_HERE = re.compile(r"You \(([A-Z])\) are at \((\d+), (\d+)\)\. Your goal is at \((\d+), (\d+)\)\.((?: Agent [A-Z] is at \(\d+, \d+\)\.)*)")  # fmt: skip
_OTHER = re.compile(r"Agent [A-Z] is at \((\d+), (\d+)\)")


def reply_to_prompt(text: str) -> Message:
    """The next move for the conversation so far (text of every message, or a rendered prompt)."""
    maps, heres = _MAP.findall(text), _HERE.findall(text)
    if not maps or not heres:
        return Message.assistant("I cannot see the grid.")
    rows = maps[-1].strip().splitlines()
    walls = frozenset((r, c) for r, line in enumerate(rows) for c, mark in enumerate(line) if mark == "#")
    layout = Layout(len(rows), len(rows[0]), walls)
    _, row, column, goal_row, goal_column, others = heres[-1]
    start, goal = (int(row), int(column)), (int(goal_row), int(goal_column))
    if start == goal:
        return Message.assistant("I am at my goal.")
    blocked = frozenset((int(r), int(c)) for r, c in _OTHER.findall(others))
    step = shortest_step(layout, start, goal, blocked) or shortest_step(layout, start, goal) or "up"
    call = ToolCall(id=f"call_{text.count('You (')}", name="move", arguments=json.dumps({"direction": step}))
    return Message.assistant("", tool_calls=(call,))


def scripted_reply(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    return reply_to_prompt("\n".join(m.text for m in messages))
