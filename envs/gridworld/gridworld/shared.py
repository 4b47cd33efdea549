"""Two agents on one grid: the grid lives in a sandbox (kind `gridworld.shared:grid`), so agents on different
machines share it. Each agent acts through its sandbox seat (A on seat 0, B on seat 1) and every answer
tells it what the others did since its last action.

World actions: `{"op": "join", "agent", "layout", "start", "goal"}` (the first join lays the grid out; a join
after a fresh attempt keeps the agent where it stands), `{"op": "move", "direction"}`, `{"op": "look"}`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gridworld import MOVE_TOOL, Grid, Layout, direction_of, where
from rollout.contracts import Message
from rollout.harness import BadToolCall, End, Observation, RunContext, Task
from rollout.sandbox import SandboxClient
from rollout.sandbox.client import SandboxActionError


class SharedGrid:
    def __init__(self, workdir: Path, seats: int) -> None:
        self.seats = seats
        self.grid: Grid | None = None
        self.agents: dict[int, str] = {}
        self.news: list[str] = []
        self.read_up_to: dict[int, int] = {}

    async def reset(self) -> None:
        self.grid, self.agents, self.news, self.read_up_to = None, {}, [], {}

    async def act(self, seat: int, action: dict[str, Any]) -> dict[str, Any]:
        op = action.get("op")
        if op == "join":
            if self.grid is None:
                self.grid = Grid(Layout.from_json(str(action["layout"])))
            agent = str(action["agent"])
            self.agents[seat] = agent
            self.grid.positions.setdefault(agent, tuple(action["start"]))
            self.grid.goals[agent] = tuple(action["goal"])
            return self._view(seat, moved=None)
        if self.grid is None or seat not in self.agents:
            raise ValueError("join the grid first: {'op': 'join', 'agent', 'layout', 'start', 'goal'}")
        if op == "look":
            return self._view(seat, moved=None)
        if op == "move":
            agent, direction = self.agents[seat], str(action.get("direction", ""))
            moved = self.grid.move(agent, direction)
            row, column = self.grid.positions[agent]
            self.news.append(
                f"Agent {agent} moved {direction} to ({row}, {column})."
                if moved
                else f"Agent {agent} tried {direction} and was blocked."
            )
            return self._view(seat, moved=moved)
        raise ValueError(f"op must be join, look or move, not {op!r}")

    def _view(self, seat: int, *, moved: bool | None) -> dict[str, Any]:
        assert self.grid is not None
        agent = self.agents[seat]
        mine = f"Agent {agent} "
        news = [line for line in self.news[self.read_up_to.get(seat, 0) :] if not line.startswith(mine)]
        self.read_up_to[seat] = len(self.news)
        return {
            "moved": moved,
            "arrived": self.grid.arrived(agent),
            "news": news,
            "where": where(self.grid, agent),
            "picture": self.grid.picture(agent),
        }

    async def close(self) -> None:
        return None


def grid(workdir: Path, seats: int) -> SharedGrid:
    """The sandbox kind `gridworld.shared:grid`."""
    return SharedGrid(workdir, seats)


class SharedWalk(Task):
    """Agent A or B walking the shared grid in the episode's sandbox."""

    def __init__(self, parameters: dict[str, str], agent: str) -> None:
        self.agent = agent
        self.join = {
            "op": "join",
            "agent": agent,
            "layout": parameters["layout"],
            "start": json.loads(parameters[f"start_{agent}"]),
            "goal": json.loads(parameters[f"goal_{agent}"]),
        }
        self.box: SandboxClient | None = None
        self.moves = self.bumps = self.seen = 0

    async def start(self, run: RunContext) -> Observation:
        if run.sandbox is None:
            raise RuntimeError("SharedWalk needs a sandbox seat: its environment declares one")
        self.box = SandboxClient(run.sandbox)
        view = await self.box.act(self.join)
        text = (
            f"You are agent {self.agent}. Walk to your goal G; another agent walks the same grid at the same "
            f"time. Rows count from 0 at the top, columns from 0 at the left. Call the move tool with up, down, "
            f"left or right; walls (#) and agents block the way.\nMap:\n{view['picture']}\n\n"
            f"{self._news(view)}{view['where']}"
        )
        return Observation(text, tools=(MOVE_TOOL,))

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        assert self.box is not None
        if not reply.tool_calls:
            view = await self.box.act({"op": "look"})
            return Observation(f"Use the move tool. {self._news(view)}{view['where']}")
        results = []
        for call in reply.tool_calls:
            try:
                direction = direction_of(call)
            except BadToolCall as error:
                results.append(Message(role="tool", text=f"Invalid move: {error}", tool_call_id=call.id))
                continue
            try:
                view = await self.box.act({"op": "move", "direction": direction})
            except SandboxActionError as error:
                results.append(Message(role="tool", text=f"Invalid move: {error}", tool_call_id=call.id))
                continue
            self.moves += bool(view["moved"])
            self.bumps += not view["moved"]
            what = f"You moved {direction}." if view["moved"] else "Blocked: you did not move."
            results.append(
                Message(role="tool", text=f"{what} {self._news(view)}{view['where']}", tool_call_id=call.id)
            )
            if view["arrived"]:
                await self.box.aclose()
                metrics: dict[str, float] = {
                    "moves": self.moves,
                    "bumps": self.bumps,
                    "others_moves_seen": self.seen,
                }
                return End(tuple(results), reward=1.0, metrics=metrics)
        return Observation(tuple(results))

    def _news(self, view: dict[str, Any]) -> str:
        self.seen += len(view["news"])
        return "".join(f"{line} " for line in view["news"])
