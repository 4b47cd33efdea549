"""Gridworld: agents walk a walled grid to their goals with a `move` tool. Pure rules here, no I/O.

Coordinates are (row, column) from the top-left corner. A `Layout` is the walls and size; `Grid` adds where
each agent (a letter) stands and where its goal is. A move into a wall, off the grid or onto another agent is
refused and leaves the agent where it was. `shortest_step` is the move of a shortest path (the scripted
policy).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

from rollout.contracts import ToolCall, ToolSpec
from rollout.harness import BadToolCall, tool_arguments

Cell = tuple[int, int]
DIRECTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

MOVE_TOOL = ToolSpec(
    name="move",
    description="Move one cell on the grid: up, down, left or right.",
    parameters={
        "type": "object",
        "properties": {"direction": {"type": "string", "enum": list(DIRECTIONS)}},
        "required": ["direction"],
    },
)


@dataclass(frozen=True)
class Layout:
    rows: int
    columns: int
    walls: frozenset[Cell] = frozenset()

    def open(self, cell: Cell) -> bool:
        row, column = cell
        return 0 <= row < self.rows and 0 <= column < self.columns and cell not in self.walls

    def to_json(self) -> str:
        return json.dumps({"rows": self.rows, "columns": self.columns, "walls": sorted(self.walls)})

    @staticmethod
    def from_json(text: str) -> Layout:
        data = json.loads(text)
        return Layout(data["rows"], data["columns"], frozenset((r, c) for r, c in data["walls"]))


@dataclass
class Grid:
    layout: Layout
    positions: dict[str, Cell] = field(default_factory=dict[str, Cell])
    goals: dict[str, Cell] = field(default_factory=dict[str, Cell])

    def move(self, agent: str, direction: str) -> bool:
        """Move `agent` one cell; False (and no move) into a wall, off the grid or onto another agent."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}")
        (row, column), (d_row, d_column) = self.positions[agent], DIRECTIONS[direction]
        target = (row + d_row, column + d_column)
        if not self.layout.open(target) or target in (p for a, p in self.positions.items() if a != agent):
            return False
        self.positions[agent] = target
        return True

    def arrived(self, agent: str) -> bool:
        return self.positions[agent] == self.goals[agent]

    def picture(self, me: str) -> str:
        """The map: # wall, . floor, your letter and goal (G), the others' letters."""
        rows = []
        for row in range(self.layout.rows):
            line = []
            for column in range(self.layout.columns):
                cell = (row, column)
                mark = "#" if cell in self.layout.walls else "."
                if cell == self.goals.get(me):
                    mark = "G"
                for agent, position in self.positions.items():
                    if position == cell:
                        mark = agent
                line.append(mark)
            rows.append("".join(line))
        return "\n".join(rows)


def direction_of(call: ToolCall) -> str:
    """The direction a move call names; `BadToolCall` (the policy's mistake, told to it) for anything else."""
    direction = tool_arguments(call).get("direction")
    if not isinstance(direction, str) or direction not in DIRECTIONS:
        raise BadToolCall(f'"direction" must be one of {", ".join(DIRECTIONS)}')
    return direction


def where(grid: Grid, me: str) -> str:
    """One line the scripted policy (and a model) can read: position, goal, others."""
    (row, column), (goal_row, goal_column) = grid.positions[me], grid.goals[me]
    others = "".join(
        f" Agent {a} is at ({r}, {c}){', at its goal' if grid.goals.get(a) == (r, c) else ''}."
        for a, (r, c) in sorted(grid.positions.items())
        if a != me
    )
    return f"You ({me}) are at ({row}, {column}). Your goal is at ({goal_row}, {goal_column}).{others}"


def distance(layout: Layout, start: Cell, goal: Cell) -> int | None:
    """Moves on a shortest path from start to goal around the walls; None when the goal cannot be reached."""
    steps = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return steps[cell]
        for d_row, d_column in DIRECTIONS.values():
            step = (cell[0] + d_row, cell[1] + d_column)
            if layout.open(step) and step not in steps:
                steps[step] = steps[cell] + 1
                queue.append(step)
    return None


def shortest_step(
    layout: Layout, start: Cell, goal: Cell, blocked: frozenset[Cell] = frozenset()
) -> str | None:
    """The first move of a shortest path from start to goal avoiding walls and `blocked`; None if there is
    none."""
    first: dict[Cell, str | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return first[cell]
        for name, (d_row, d_column) in DIRECTIONS.items():
            step = (cell[0] + d_row, cell[1] + d_column)
            if layout.open(step) and step not in blocked and step not in first:
                first[step] = first[cell] or name
                queue.append(step)
    return None
