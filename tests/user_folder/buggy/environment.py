"""A user's environment whose tasks misbehave by group: most answer a sum, and the rest each fail one way.

Group g plays mode `MODES[g % len(MODES)]`: `good` (reward for the right sum), `hang` (respond never returns),
`raise` (respond raises), `nan` (a NaN reward), `long` (an observation far past any small model's context),
`scripted` (its scripted reply raises: `rollout env check` finds it; a run, which samples a model, plays it
as a good one). The task source raises for group `BROKEN_DRAW` and blocks for a minute on `STUCK_DRAW`.
Every call into its code is bounded at 2 s (`turn_timeout_s`).
"""

from __future__ import annotations

import asyncio
import time

from rollout.contracts import Message, ToolSpec
from rollout.environment import Environment, TaskParameters, TaskSource
from rollout.harness import End, Observation, RunContext, Task

MODES = ("good", "hang", "raise", "nan", "long", "good", "scripted", "good")
BROKEN_DRAW = 5
STUCK_DRAW = 9  # its draw blocks (a synchronous call that never returns in time)


class Modes(TaskSource):
    def parameters(self, group: int) -> TaskParameters:
        if group == BROKEN_DRAW:
            raise IndexError(f"no row for group {group}")
        if group == STUCK_DRAW:
            time.sleep(60)
        return {"mode": MODES[group % len(MODES)], "a": str(group % 7), "b": "2"}


class Buggy(Task):
    def __init__(self, parameters: TaskParameters) -> None:
        self.mode = parameters["mode"]
        self.answer = int(parameters["a"]) + int(parameters["b"])

    async def start(self, run: RunContext) -> Observation:
        return Observation(f"mode {self.mode}: what is {self.answer - 2} + 2? Reply with the number only.")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "raise":
            raise KeyError("no such answer")
        if self.mode == "nan":
            return End(reward=float("nan"))
        if self.mode == "long":
            return Observation("word " * 300_000)
        # Partial credit that varies with the reply, so a small random model's groups carry signal.
        right = reply.text.strip() == str(self.answer)
        return End(reward=1.0 if right else len(set(reply.text)) / (1 + len(reply.text)))


def scripted(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    if messages[0].text.startswith("mode scripted"):
        raise ValueError("the scripted reply has no answer for this task")
    a, b = messages[0].text.split("what is ")[1].split("?")[0].split(" + ")
    return Message.assistant(str(int(a) + int(b)))


environment = Environment(
    name="buggy",
    make_task=lambda parameters, agent: Buggy(parameters),
    source=Modes(),
    group_size=2,
    max_turns=2,
    scripted_reply=scripted,
    turn_timeout_s=2.0,
    episode_timeout_s=30.0,
)
