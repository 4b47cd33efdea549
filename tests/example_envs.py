"""Environments for tests: ones that misbehave on purpose, to check how the platform copes."""

from __future__ import annotations

from rollout.contracts import Message, ToolSpec
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


class BadTools(Task):
    async def start(self, run: RunContext) -> Observation:
        schema = {"type": "object", "properties": {}, "required": ["cmd"]}
        return Observation("use a tool", tools=(ToolSpec(name="run shell", parameters=schema),))

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=0.0)


bad_tools = Environment("bad-tools", lambda parameters, agent: BadTools(), Dataset([{}]), group_size=1)
