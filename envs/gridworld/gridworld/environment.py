"""Gridworld environments. `environment`: one agent walks a walled 6x6 grid from a corner to the opposite one
(10 moves on a shortest path) with the `move` tool; deterministic, so a retried attempt resumes by replay.
`two_agents`: agents A and B share one grid sandbox (kind `gridworld.shared:grid`), crossing paths; each sees
the other's moves, and each has its own reward. `uv run rollout env check gridworld.environment:environment`.
"""

from __future__ import annotations

import json
import random

from gridworld import MOVE_TOOL, Grid, Layout, direction_of, distance, where
from gridworld.policy import scripted_reply
from gridworld.shared import SharedWalk
from rollout.contracts import Message
from rollout.environment import AgentSeatSpec, Environment, Generator, SandboxSpec, TaskParameters
from rollout.harness import BadToolCall, End, Observation, RunContext, Task

EVAL_SEED = 1_000_003  # held-out walks: training draws seed 0
WALLS = 1  # few walls: two agents with views a move or two old cross an open grid without a corridor standoff
RULES = (
    "Rows count from 0 at the top, columns from 0 at the left. Call the move tool with up, down, left or "
    "right, one cell at a time; walls (#) and other agents block the way."
)


def walled_layout(rng: random.Random, size: int, corners: list[tuple[int, int]], walls: int) -> Layout:
    """A size x size layout with `walls` walls that keep every corner pair at its Manhattan distance."""
    while True:
        free = [(r, c) for r in range(size) for c in range(size) if (r, c) not in corners]
        layout = Layout(size, size, frozenset(rng.sample(free, walls)))
        pairs = zip(corners[::2], corners[1::2], strict=True)
        if all(distance(layout, a, b) == abs(a[0] - b[0]) + abs(a[1] - b[1]) for a, b in pairs):
            return layout


def one_walk(rng: random.Random) -> TaskParameters:
    corners = rng.choice([[(0, 0), (5, 5)], [(5, 5), (0, 0)], [(0, 5), (5, 0)], [(5, 0), (0, 5)]])
    layout = walled_layout(rng, 6, corners, walls=6)
    return {"layout": layout.to_json(), "start": json.dumps(corners[0]), "goal": json.dumps(corners[1])}


def _cell(text: str) -> tuple[int, int]:
    row, column = json.loads(text)
    return int(row), int(column)


class Walk(Task):
    """One agent (A) on its own grid, kept in the Task: deterministic, replayable."""

    def __init__(self, parameters: TaskParameters) -> None:
        layout = Layout.from_json(parameters["layout"])
        self.grid = Grid(layout, {"A": _cell(parameters["start"])}, {"A": _cell(parameters["goal"])})
        self.moves = self.bumps = 0

    async def start(self, run: RunContext) -> Observation:
        text = f"Walk to your goal G on this grid. {RULES}\nMap:\n{self.grid.picture('A')}\n\n{where(self.grid, 'A')}"
        return Observation(text, tools=(MOVE_TOOL,))

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        if not reply.tool_calls:
            return Observation(f"Use the move tool. {where(self.grid, 'A')}")
        results = []
        for call in reply.tool_calls:
            try:
                direction = direction_of(call)
                moved = self.grid.move("A", direction)
            except BadToolCall as error:
                results.append(Message(role="tool", text=f"Invalid move: {error}", tool_call_id=call.id))
                continue
            self.moves += moved
            self.bumps += not moved
            what = f"You moved {direction}." if moved else "Blocked: you did not move."
            results.append(Message(role="tool", text=f"{what} {where(self.grid, 'A')}", tool_call_id=call.id))
            if self.grid.arrived("A"):
                return End(tuple(results), reward=1.0, metrics={"moves": self.moves, "bumps": self.bumps})
        return Observation(tuple(results))


environment = Environment(
    name="gridworld",
    make_task=lambda parameters, agent: Walk(parameters),
    source=Generator(one_walk),
    eval_source=Generator(one_walk, seed=EVAL_SEED),
    group_size=4,
    max_turns=24,
    description="Walk a walled 6x6 grid corner to corner with a move tool; reward 1 at the goal.",
    scripted_reply=scripted_reply,
)


def two_walks(rng: random.Random) -> TaskParameters:
    # A goes top-left to bottom-right, B bottom-left to top-right: their paths cross mid-grid.
    corners = [(0, 0), (4, 4), (4, 0), (0, 4)]
    layout = walled_layout(rng, 5, corners, walls=WALLS)
    return {
        "layout": layout.to_json(),
        "start_A": "[0, 0]",
        "goal_A": "[4, 4]",
        "start_B": "[4, 0]",
        "goal_B": "[0, 4]",
    }


two_agents = Environment(
    name="gridworld-two-agents",
    make_task=lambda parameters, agent: SharedWalk(parameters, agent),
    source=Generator(two_walks),
    eval_source=Generator(two_walks, seed=EVAL_SEED),
    agents=(AgentSeatSpec("A"), AgentSeatSpec("B")),
    group_size=2,
    max_turns=30,
    sandbox=SandboxSpec("gridworld.shared:grid", seats=2),
    replayable=False,  # the grid lives in the sandbox, outside the Task: a retried attempt cannot replay it
    description="Two agents share one grid sandbox and see each other's moves; each is rewarded at its own goal.",
    scripted_reply=scripted_reply,
)
