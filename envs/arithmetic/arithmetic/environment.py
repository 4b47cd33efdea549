"""The arithmetic environment: generated two-operand questions, one agent, one turn, reward 1 for the exact answer.

`uv run rollout env check arithmetic.environment:environment` plays it against the scripted model.
"""

from __future__ import annotations

import random
import re

from arithmetic import Arithmetic
from rollout.contracts import Message, ToolSpec
from rollout.environment import Environment, Generator, TaskParameters


def question(rng: random.Random) -> TaskParameters:
    """A question whose answer is an integer: a + b, a - b or a * b with small operands."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*")
    if op == "*":
        a, b = a % 13, b % 13
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"question": f"What is {a} {op} {b}? Answer with the number only.", "answer": str(answer)}


def solve(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    """A scripted model that does the arithmetic (for `rollout env check` and the tutorial)."""
    found = re.findall(r"What is (-?\d+) ([+*-]) (-?\d+)\?", messages[-1].text)
    if not found:
        return Message.assistant("I do not know.")
    a, op, b = found[-1]
    return Message.assistant(str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]))


environment = Environment(
    name="arithmetic",
    make_task=lambda parameters, agent: Arithmetic(parameters),
    source=Generator(question),
    group_size=4,
    max_turns=1,
    description="One question, one answer; reward 1 when the reply is exactly the answer.",
    scripted_reply=solve,
)
