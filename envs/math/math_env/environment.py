"""The math environment: multi-step word problems (a small dataset shipped in the package) solved with a
calculator tool. One agent, up to 8 turns; reward 1 when the final `Answer: N` equals the dataset's answer.
`uv run rollout env check math_env.environment:environment`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from math_env import CALCULATOR_TOOL, CalculatorError, calculate, number_text
from rollout.contracts import Message, ToolCall, ToolSpec
from rollout.environment import Dataset, Environment, TaskParameters
from rollout.harness import BadToolCall, End, Observation, RunContext, Task, tool_arguments

INSTRUCTIONS = (
    "Solve the problem. Use the calculator tool for every computation, then reply with the final "
    "line `Answer: N` and nothing after it."
)
_ANSWER = re.compile(r"Answer:\s*(-?[\d,]*\.?\d+)")


@dataclass(frozen=True)
class Problem:
    question: str
    steps: tuple[str, ...]  # the reference solution's calculator expressions, in order
    answer: str


@cache
def problems() -> tuple[Problem, ...]:
    data = json.loads(resources.files("math_env").joinpath("problems.json").read_text())
    return tuple(Problem(row["question"], tuple(row["steps"]), row["answer"]) for row in data)


HELD_OUT = 6  # the last problems are held out for evals: training never sees them


def rows() -> list[TaskParameters]:
    return [{"question": p.question, "answer": p.answer} for p in problems()]


def final_answer(text: str) -> float | None:
    found = _ANSWER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


class WordProblem(Task):
    def __init__(self, parameters: TaskParameters) -> None:
        self.question = parameters["question"]
        self.answer = float(parameters["answer"])
        self.calls = 0

    async def start(self, run: RunContext) -> Observation:
        return Observation(f"{self.question}\n\n{INSTRUCTIONS}", tools=(CALCULATOR_TOOL,))

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        if reply.tool_calls:
            results = []
            for call in reply.tool_calls:
                self.calls += 1
                try:
                    expression = str(tool_arguments(call).get("expression", ""))
                    text = number_text(calculate(expression))
                except (CalculatorError, BadToolCall, OverflowError) as error:
                    text = f"error: {error}"
                results.append(Message(role="tool", text=text, tool_call_id=call.id))
            return Observation(tuple(results))
        given = final_answer(reply.text)
        correct = given is not None and abs(given - self.answer) <= 1e-6 * max(1.0, abs(self.answer))
        return End(
            reward=1.0 if correct else 0.0,
            metrics={"calculator_calls": self.calls, "answered": float(given is not None)},
        )


def solve(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    """A scripted solver: it knows each problem's reference steps and calls the calculator for each in
    turn."""
    text = "\n".join(m.text for m in messages)
    problem = next((p for p in problems() if p.question in text), None)
    if problem is None:
        return Message.assistant("I do not know this problem.")
    steps = problem.steps
    done = sum(1 for m in messages if m.role == "tool")
    if done < len(steps):
        call = ToolCall(
            id=f"call_{done}", name="calculator", arguments=json.dumps({"expression": steps[done]})
        )
        return Message.assistant("", tool_calls=(call,))
    return Message.assistant(f"Answer: {messages[-1].text}")


environment = Environment(
    name="math",
    make_task=lambda parameters, agent: WordProblem(parameters),
    source=Dataset(rows()[:-HELD_OUT]),
    eval_source=Dataset(rows()[-HELD_OUT:]),
    group_size=4,
    max_turns=8,
    description="Word problems with a calculator tool; reward 1 for the exact final answer.",
    scripted_reply=solve,
)
