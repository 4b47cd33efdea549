"""Environments for tests: ones that misbehave on purpose, to check how the platform copes."""

from __future__ import annotations

from rollout.contracts import Message
from rollout.environment import Dataset, Environment
from rollout.harness import End, Observation, RunContext, Task


class Raises(Task):
    async def start(self, run: RunContext) -> Observation:
        return Observation("say anything")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        raise RuntimeError("the environment broke on purpose")


class NotFinite(Task):
    async def start(self, run: RunContext) -> Observation:
        return Observation("say anything")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=float("nan"))


raises = Environment("raises", lambda parameters, agent: Raises(), Dataset([{}]), group_size=1)
not_finite = Environment("not-finite", lambda parameters, agent: NotFinite(), Dataset([{}]), group_size=1)
not_an_environment = 42
