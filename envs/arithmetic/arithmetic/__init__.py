"""Arithmetic: one question, one answer, reward 1 when the reply is exactly the answer.

The smallest environment rollout ships; the design's seed example, kept verbatim.
"""

from rollout.contracts import Message
from rollout.harness import End, Observation, RunContext, Task


class Arithmetic(Task):
    def __init__(self, parameters: dict[str, str]) -> None:
        self.question, self.answer = parameters["question"], parameters["answer"]

    async def start(self, run: RunContext) -> Observation:
        return Observation(self.question)

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=1.0 if reply.text.strip() == self.answer else 0.0)
