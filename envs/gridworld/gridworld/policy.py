"""The scripted gridworld player: reads the map and positions from the conversation's text, moves along a
shortest path. It works on the rendered prompt too, so the scripted engine can play it through the gateway
(`gridworld.policy:reply_to_prompt`).

With other agents on the grid, agents give way by letter, so two agents never dance around each other forever:
the first letter walks around the others' cells (waiting, by bumping, when they block its only way); a later
letter also keeps off the cells next to earlier letters still walking, and when that leaves it no way, steps
away from them.
"""

from __future__ import annotations

import json
import re

from gridworld import DIRECTIONS, Cell, Layout, shortest_step
from rollout.contracts import Message, ToolCall, ToolSpec

_MAP = re.compile(r"Map:\n((?:[#.A-Z]+\n?)+)")
_HERE = re.compile(
    r"You \(([A-Z])\) are at \((\d+), (\d+)\)\. Your goal is at \((\d+), (\d+)\)\.((?: Agent [A-Z] is at \(\d+, \d+\)(?:, at its goal)?\.)*)"
)
_OTHER = re.compile(r"Agent ([A-Z]) is at \((\d+), (\d+)\)(, at its goal)?")


def reply_to_prompt(text: str) -> Message:
    """The next move for the conversation so far (text of every message, or a rendered prompt)."""
    maps, heres = _MAP.findall(text), _HERE.findall(text)
    if not maps or not heres:
        return Message.assistant("I cannot see the grid.")
    rows = maps[-1].strip().splitlines()
    walls = frozenset((r, c) for r, line in enumerate(rows) for c, mark in enumerate(line) if mark == "#")
    layout = Layout(len(rows), len(rows[0]), walls)
    me, row, column, goal_row, goal_column, others = heres[-1]
    start, goal = (int(row), int(column)), (int(goal_row), int(goal_column))
    if start == goal:
        return Message.assistant("I am at my goal.")
    step = _next_move(layout, start, goal, me, _OTHER.findall(others))
    call = ToolCall(id=f"call_{text.count('You (')}", name="move", arguments=json.dumps({"direction": step}))
    return Message.assistant("", tool_calls=(call,))


def _next_move(
    layout: Layout, start: Cell, goal: Cell, me: str, others: list[tuple[str, str, str, str]]
) -> str:
    cells = {(int(r), int(c)): (letter, bool(arrived)) for letter, r, c, arrived in others}
    occupied = frozenset(cells)
    # Agents I give way to: earlier letters still walking (one at its goal is just an obstacle).
    ahead = [cell for cell, (letter, arrived) in cells.items() if letter < me and not arrived]
    near_ahead = frozenset((r + dr, c + dc) for r, c in ahead for dr, dc in DIRECTIONS.values())
    step = shortest_step(layout, start, goal, occupied | near_ahead)
    if step is None and ahead:
        # Boxed in by an agent I give way to: step to the free neighbour farthest from it.
        def room(direction: str) -> int:
            cell = (start[0] + DIRECTIONS[direction][0], start[1] + DIRECTIONS[direction][1])
            if not layout.open(cell) or cell in occupied:
                return -1
            return min(abs(cell[0] - r) + abs(cell[1] - c) for r, c in ahead)

        best = max(DIRECTIONS, key=room)
        step = best if room(best) > min(abs(start[0] - r) + abs(start[1] - c) for r, c in ahead) else None
    return step or shortest_step(layout, start, goal, occupied) or shortest_step(layout, start, goal) or "up"


def scripted_reply(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    return reply_to_prompt("\n".join(m.text for m in messages))
