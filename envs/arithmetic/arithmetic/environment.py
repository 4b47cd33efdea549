"""The arithmetic environment: generated two-operand questions, one agent, one turn, reward 1 for the exact
answer.

A wrong reply earns partial credit (under 0.5): a number near the answer, and a short reply. Small models
start near zero exact answers; shaping gives every group a signal to climb (the `learning` benchmark), and an
exact answer is always worth the most.

`uv run rollout env check arithmetic.environment:environment` plays it against the scripted model.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from arithmetic import Arithmetic
from rollout.contracts import Message, ToolSpec
from rollout.environment import Environment, Generator, TaskParameters
from rollout.harness import End, Observation, RunContext


def score(reply: str, answer: str) -> float:
    """1 for exactly the answer; otherwise up to 0.3 for a first number near it plus up to 0.1 for brevity."""
    text = reply.strip()
    if text == answer:
        return 1.0
    # At most 30 digits: a number of thousands is no nearer, and Python refuses to read one past 4,300.
    numbers = re.findall(r"(?<!\d)-?\d{1,30}(?!\d)", text)
    nearness = 0.3 / (1 + abs(int(numbers[0]) - int(answer))) if numbers else 0.0
    brevity = 0.1 * max(0.0, 1 - len(text) / 64)
    return round(nearness + brevity, 4)


class ShapedArithmetic(Arithmetic):
    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=score(reply.text, self.answer))


def question(rng: random.Random) -> TaskParameters:
    """A question whose answer is an integer: a + b, a - b or a * b with small operands."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*")
    if op == "*":
        a, b = a % 13, b % 13
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"question": f"What is {a} {op} {b}? Answer with the number only.", "answer": str(answer)}


EVAL_SEED = 1_000_003  # held-out questions: training draws seed 0


def solve(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    """A scripted model that does the arithmetic (for `rollout env check` and the tutorial)."""
    found = re.findall(r"What is (-?\d+) ([+*-]) (-?\d+)\?", messages[-1].text)
    if not found:
        return Message.assistant("I do not know.")
    a, op, b = found[-1]
    return Message.assistant(str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]))


environment = Environment(
    name="arithmetic",
    make_task=lambda parameters, agent: ShapedArithmetic(parameters),
    source=Generator(question),
    eval_source=Generator(question, seed=EVAL_SEED),
    group_size=4,
    max_turns=1,
    description="One question, one answer; reward 1 when the reply is exactly the answer, partial credit below 0.5.",
    scripted_reply=solve,
)


def easy_question(rng: random.Random) -> TaskParameters:
    """A one-digit sum: what a 135M-parameter model can learn to answer exactly within minutes."""
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return {"question": f"What is {a} + {b}? Answer with the number only.", "answer": str(a + b)}


# The quickstart's task (README): one-digit sums, so the curve of a small model on a laptop CPU rises within
# minutes.
# The same task, reward and seats as `environment`, on easier questions.
easy = replace(
    environment,
    name="arithmetic-easy",
    source=Generator(easy_question),
    eval_source=Generator(easy_question, seed=EVAL_SEED),
    description="One-digit sums; reward 1 when the reply is exactly the answer, partial credit below 0.5.",
)
