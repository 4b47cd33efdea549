"""`heavytail`: arithmetic questions in a chain, one per turn, with heavy-tailed episode lengths (the `async`
benchmark's environment).

Contract:
- An episode asks `turns` questions, one after another; its reward is the mean `score` of its answers (the
  shaped arithmetic reward, so a small model has signal). Each answer waits `tool_s` before the next question,
  the way an agent waits for a tool.
- `turns` is drawn per episode, not per group (members of one group differ in length, as real agents do), from
  a Pareto law with tail index `ALPHA`: P(turns > n) = n^-ALPHA, capped at `MAX_TURNS`. With ALPHA 1.1 half
  the episodes take 1 turn and one in twenty takes 16 or more. The draw is seeded by run and episode, so a
  retried attempt plays the same length (replay stays exact).
"""

from __future__ import annotations

import asyncio
import math
import random

from arithmetic.environment import question, score
from rollout.contracts import Message
from rollout.environment import Environment, Generator, TaskParameters
from rollout.harness import End, Observation, RunContext, Task

ALPHA = 1.1
MAX_TURNS = 24
TOOL_S = 0.05


def episode_turns(run: str, episode: str) -> int:
    """How many questions this episode asks: heavy-tailed, the same on every attempt."""
    u = random.Random(f"heavytail/{run}/{episode}").random()
    return min(MAX_TURNS, math.ceil((1.0 - u) ** (-1.0 / ALPHA)))


class QuestionChain(Task):
    def __init__(self, parameters: TaskParameters) -> None:
        self.seed = parameters["seed"]
        self.scores: list[float] = []
        self.turns = 1
        self.answer = ""

    def _ask(self) -> Observation:
        asked = question(random.Random(f"{self.seed}/{len(self.scores)}"))
        self.answer = asked["answer"]
        return Observation(asked["question"])

    async def start(self, run: RunContext) -> Observation:
        self.turns = episode_turns(run.run, run.episode)
        return self._ask()

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        self.scores.append(score(reply.text, self.answer))
        await asyncio.sleep(TOOL_S)
        if len(self.scores) >= self.turns:
            return End(reward=sum(self.scores) / len(self.scores), metrics={"turns": float(self.turns)})
        return self._ask()


environment = Environment(
    name="heavytail",
    make_task=lambda parameters, agent: QuestionChain(parameters),
    source=Generator(lambda rng: {"seed": str(rng.randrange(1 << 30))}),
    group_size=4,
    max_turns=MAX_TURNS,
    description="A chain of arithmetic questions of heavy-tailed length; reward = mean shaped score.",
)
