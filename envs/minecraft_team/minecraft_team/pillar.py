"""The pillar task: four bots build a pillar of four wool blocks on a gold block, one block each.

Contract:
- `pillar_site(rng)` draws a task: the gold block's column near the world's centre and four starts on a ring
  6 to 9 blocks from it, one per seat (plain strings: the same on every machine and every retry).
- `PillarBuilder` is one agent's side. At start it sets up its seat in the claimed world (the gold block,
  which every seat places idempotently; its bot moved to its start with `WOOL_PER_AGENT` blocks of its colour)
  and shows the goal and a first observation. Each reply's tool calls go to the world (`MINECRAFT_TOOLS`); a
  call the world refuses is answered with the reason and the turn goes on. A world that is lost or a claim
  that was superseded raises: the attempt is abandoned, never trained.
- Reward, for each agent, in [0, 1]: `APPROACH` x how far it closed in on the gold block (its closest, from
  its start to within `NEAR` blocks) + `OWN_BLOCK` when a block it placed is in the pillar + `TEAM` x the
  pillar's height out of `HEIGHT` (the team bonus: every agent gets it) + `FOCUS` x how little it wrote
  besides its tool calls (the mean over its replies of 1 - words' characters / `FOCUS_CHARS`, floored at 0: a
  small model's first lesson is to act rather than ramble, and it is one a random policy already varies on).
  The agent's episode ends when the pillar stands `HEIGHT` high, or after `ACTIONS` replies, with that reward.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from rollout.contracts import Message
from rollout.environment import TaskParameters
from rollout.harness import End, Observation, RunContext, Task
from rollout.sandbox import SandboxClient
from rollout.sandbox.client import SandboxActionError
from rollout.sandbox.minecraft import BOT_NAMES
from rollout.sandbox.minecraft.tools import MINECRAFT_TOOLS, action_for, observation_text, result_text

AGENTS = 4
HEIGHT = 4
ACTIONS = 8
NEAR = 3.0
WOOL_PER_AGENT = 2
APPROACH, OWN_BLOCK, TEAM, FOCUS = 0.2, 0.35, 0.4, 0.05
FOCUS_CHARS = 200
COLOURS = ("red", "blue", "yellow", "lime")


def pillar_site(rng: random.Random) -> TaskParameters:
    marker = [rng.randint(-4, 4), rng.randint(-4, 4)]
    first = rng.uniform(0, 2 * math.pi)
    starts = []
    for seat in range(AGENTS):
        angle = first + seat * math.pi / 2 + rng.uniform(-0.4, 0.4)
        radius = rng.uniform(6, 9)
        starts.append(
            [round(marker[0] + radius * math.cos(angle)), round(marker[1] + radius * math.sin(angle))]
        )
    return {"marker": json.dumps(marker), "starts": json.dumps(starts)}


def goal_text(name: str, gold: list[int], actions: int) -> str:
    others = ", ".join(n for n in BOT_NAMES[:AGENTS] if n != name)
    x, y, z = gold
    return (
        f"You are {name}, one of four builders in a Minecraft world (the others: {others}). Team goal: a pillar "
        f"of {HEIGHT} wool blocks on the gold block at ({x}, {y}, {z}). Each builder places one block of their "
        f"wool on top of the pillar, in the first empty cell above the gold block. Walk to within {NEAR:g} blocks "
        "of it first (move_to), then place, then wait for the others. You are rewarded for getting close, for "
        f"your block in the pillar, and for the finished pillar. You have {actions} actions: call one tool per turn."
    )


class PillarBuilder(Task):
    def __init__(self, parameters: TaskParameters, agent: str) -> None:
        self.agent = agent
        self.marker: list[int] = json.loads(parameters["marker"])
        self.starts: list[list[int]] = json.loads(parameters["starts"])
        self.box: SandboxClient | None = None
        self.seat = 0
        self.gold: list[int] = []
        self.start_distance = self.closest = 0.0
        self.replies = self.refused = self.placed = 0
        self.focus = 0.0  # the sum over replies of 1 - their words' characters / FOCUS_CHARS
        self.others_seen: set[str] = set()  # the other bots this agent's observations showed

    async def start(self, run: RunContext) -> Observation:
        if run.sandbox is None:
            raise RuntimeError("PillarBuilder needs a minecraft sandbox seat: its environment declares one")
        self.box = SandboxClient(run.sandbox)
        self.seat = run.sandbox.seat
        try:
            return await self._set_up()
        except BaseException:
            await self._close()
            raise

    async def _set_up(self) -> Observation:
        assert self.box is not None
        ground = int((await self.box.act({"op": "observe"}))["ground_y"])
        self.gold = [self.marker[0], ground + 1, self.marker[1]]
        start = self.starts[self.seat % len(self.starts)]
        view = await self.box.act(
            {
                "op": "setup",
                "blocks": [{"name": "gold_block", "at": self.gold}],
                "start": [start[0], ground + 1, start[1]],
                "items": [{"name": f"{COLOURS[self.seat % len(COLOURS)]}_wool", "count": WOOL_PER_AGENT}],
            }
        )
        self.start_distance = self.closest = self._distance(view["position"])
        self._saw(view)
        text = f"{goal_text(view['name'], self.gold, ACTIONS)}\n{observation_text(view)}"
        return Observation(text, tools=MINECRAFT_TOOLS)

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        try:
            return await self._respond(reply)
        except BaseException:
            await self._close()  # the world is lost, the claim superseded, or the play cancelled
            raise

    async def _close(self) -> None:
        if self.box is not None:
            await self.box.aclose()

    async def _respond(self, reply: Message) -> Observation:
        assert self.box is not None
        self.replies += 1
        self.focus += max(0.0, 1 - len(reply.text.strip()) / FOCUS_CHARS)
        results: list[Message] = []
        if not reply.tool_calls:
            lines = ["Call one of the tools: observe, wait, move_to, look, dig, place or chat."]
        else:
            lines = []
            for call in reply.tool_calls:
                results.append(
                    Message(
                        role="tool", text=await self._call(call.name, call.arguments), tool_call_id=call.id
                    )
                )
        height, mine, position = await self._pillar()
        self.closest = min(self.closest, self._distance(position))
        status = f"The pillar is {height} of {HEIGHT} blocks high."
        if height >= HEIGHT or self.replies >= ACTIONS:
            reward = self._reward(height, mine)
            metrics = {
                "pillar_height": float(height),
                "own_block": float(mine),
                "closest": round(self.closest, 2),
                "placed": float(self.placed),
                "refused": float(self.refused),
                "others_seen": float(len(self.others_seen)),
                "focus": round(self.focus / max(self.replies, 1), 3),
            }
            await self._close()
            return End(self._answer(results, lines, status), reward=reward, metrics=metrics)
        return Observation(self._answer(results, lines, status))

    async def _call(self, name: str, arguments: str) -> str:
        assert self.box is not None
        try:
            result = await self.box.act(action_for(name, arguments))
        except (SandboxActionError, ValueError) as error:
            self.refused += 1
            return f"Refused: {error}"
        self.placed += name == "place"
        if name in ("observe", "wait"):
            self._saw(result)
        return result_text(name, result)

    def _saw(self, view: dict[str, Any]) -> None:
        self.others_seen.update(player["name"] for player in view.get("players") or [])

    @staticmethod
    def _answer(results: list[Message], lines: list[str], status: str) -> tuple[Message, ...] | str:
        if results:
            last = results[-1]
            return (
                *results[:-1],
                Message(role="tool", text=f"{last.text}\n{status}", tool_call_id=last.tool_call_id),
            )
        return "\n".join([*lines, status])

    async def _pillar(self) -> tuple[int, bool, list[float]]:
        assert self.box is not None
        x, y, z = self.gold
        cells = [[x, y + level, z] for level in range(HEIGHT + 3)]
        answer: dict[str, Any] = await self.box.act({"op": "blocks", "cells": cells})
        height, mine = 0, False
        for block in answer["blocks"][1:]:
            if block["name"] in ("air", "unknown"):
                break
            height += 1
            mine = mine or block["placed_by"] == self.seat
        return height, mine, answer["position"]

    def _distance(self, position: list[float]) -> float:
        return math.hypot(position[0] - (self.gold[0] + 0.5), position[2] - (self.gold[2] + 0.5))

    def _reward(self, height: int, mine: bool) -> float:
        span = max(self.start_distance - NEAR, 1e-6)
        approach = min(max((self.start_distance - self.closest) / span, 0.0), 1.0)
        focus = self.focus / max(self.replies, 1)
        return round(
            APPROACH * approach + OWN_BLOCK * mine + TEAM * min(height / HEIGHT, 1.0) + FOCUS * focus, 4
        )
