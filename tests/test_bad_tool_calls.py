"""A malformed tool call is the policy's mistake, never the environment's failure: the shipped environments
answer each with an error observation and the episode goes on (a policy that could fail its own episodes
could pause its own training).

The calls are what a policy can write: a number past float range (`1e999`), a thousand minus signs, brackets
nested past any parser's depth, a direction that is an object, a number of thousands of digits.
"""

from __future__ import annotations

import pytest

from rollout.contracts import Message, ToolCall
from rollout.environment import Environment
from rollout.harness import BadToolCall, End, RunContext, finite_number, tool_arguments
from rollout.sandbox.minecraft.tools import action_for

DEEP = "[" * 200_000
MINUS = "-" * 1000 + "1"


def call(name: str, arguments: str) -> Message:
    return Message.assistant("", tool_calls=(ToolCall(id="c1", name=name, arguments=arguments),))


async def answer(environment: Environment, reply: Message) -> list[str]:
    """What the environment's first task answers to `reply`: it must not raise, nor end the episode."""
    task = environment.make_task(environment.source.parameters(0), environment.agents[0].name)
    context = RunContext(run="bad-calls", episode="bad-calls/0", seat="bad-calls/0/seat")
    await task.start(context)
    observed = await task.respond(context, reply)
    assert not isinstance(observed, End), observed
    return [m.text for m in observed.messages()]


@pytest.mark.parametrize(
    "arguments",
    ['{"direction": {}}', '{"direction": ["up"]}', DEEP, MINUS, '{"direction": 1e999}', "[]"],
)
async def test_gridworld_answers_a_malformed_move_and_the_walk_goes_on(arguments: str) -> None:
    from gridworld.environment import environment

    [said] = await answer(environment, call("move", arguments))
    assert said.startswith("Invalid move: ") and "\n" not in said, said


@pytest.mark.parametrize(
    "expression",
    [MINUS, "(" * 100_000 + "1" + ")" * 100_000, "-" * 100_000 + "1", "1e999 * 1e999", "9" * 5000 + " + 1"],
)
async def test_the_calculator_answers_an_expression_it_cannot_take(expression: str) -> None:
    import json

    from math_env.environment import environment

    [said] = await answer(environment, call("calculator", json.dumps({"expression": expression})))
    assert said.startswith("error: ") or said in ("inf", "nan") or said.isdigit(), said[:200]


async def test_the_calculator_answers_arguments_that_are_not_an_object() -> None:
    from math_env.environment import environment

    for arguments in (DEEP, MINUS, "1e999"):
        [said] = await answer(environment, call("calculator", arguments))
        assert said.startswith("error: the arguments of calculator"), said


async def test_a_reply_of_thousands_of_digits_is_scored_not_failed() -> None:
    from arithmetic.environment import score

    assert score("1" * 5000, "5") == 0.0
    assert score(f"{'9' * 5000} then 6", "5") > 0.0, "the first number a person could read is scored"


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (DEEP, "nested too deeply"),
        (MINUS, "not JSON"),
        ("1e999", "must be a JSON object"),
        ('{"x": ' + "[" * 100 + "]" * 100 + "}", ""),
    ],
)
def test_tool_arguments_read_any_text_as_an_object_or_say_what_is_wrong(arguments: str, said: str) -> None:
    given = ToolCall(id="c", name="look", arguments=arguments)
    if not said:
        assert tool_arguments(given)["x"]
        return
    with pytest.raises(BadToolCall, match=said):
        tool_arguments(given)
    with pytest.raises(ValueError, match=said):  # the minecraft kind's tools: refused, one line
        action_for("look", arguments)


@pytest.mark.parametrize("value", [1e999, float("nan"), -1, 0, 10**400, True, "10", None, 121])
def test_finite_number_refuses_what_is_not_a_number_in_range(value: object) -> None:
    with pytest.raises(BadToolCall, match='"timeout_s" must be a number'):
        finite_number(value, "timeout_s", low=0.1, high=120)
    assert finite_number(30, "timeout_s", low=0.1, high=120) == 30.0


async def test_a_bad_tool_call_a_task_raises_is_told_to_the_policy_and_the_episode_goes_on() -> None:
    from rollout.activities.agent_loop import play
    from rollout.harness import Observation, Task

    class Strict(Task):
        async def start(self, run: RunContext) -> Observation:
            return Observation("Say a number with the say tool.")

        async def respond(self, run: RunContext, reply: Message) -> Observation:
            [said] = reply.tool_calls
            number = finite_number(tool_arguments(said).get("n"), "n", low=0, high=9)
            return End(reward=number / 9)

    class Policy:
        def __init__(self) -> None:
            self.sent: list[list[Message]] = []

        async def reply(self, messages: list[Message], tools: object) -> Message:
            self.sent.append(list(messages))
            return call("say", '{"n": 1e999}' if len(self.sent) == 1 else '{"n": 9}')

    policy = Policy()
    context = RunContext(run="strict", episode="strict/0", seat="strict/0/seat")
    played = await play(Strict(), context, policy, max_turns=4)
    assert played.reward == 1.0 and played.turns == 2
    told = policy.sent[1][-1]
    assert told.role == "tool" and told.tool_call_id == "c1" and told.text.startswith('error: "n" must be')
