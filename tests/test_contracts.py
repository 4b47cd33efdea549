import pytest
from pydantic import ValidationError

from arithmetic import Arithmetic
from rollout.contracts import Message, ToolCall, ToolSpec
from rollout.harness import End, Observation, RunContext


def test_message_round_trips_through_json() -> None:
    message = Message.assistant(
        "let me check", tool_calls=(ToolCall(id="c1", name="calc", arguments='{"x": 2}'),), reasoning="2+2"
    )
    assert Message.model_validate_json(message.model_dump_json()) == message


def test_only_assistants_call_tools_and_tool_messages_name_their_call() -> None:
    with pytest.raises(ValidationError, match="only assistant"):
        Message(role="user", text="hi", tool_calls=(ToolCall(id="c", name="f"),))
    with pytest.raises(ValidationError, match="tool_call_id"):
        Message(role="tool", text="4")


def test_tool_spec_defaults_to_an_empty_object_schema() -> None:
    assert ToolSpec(name="noop").parameters == {"type": "object", "properties": {}}


async def test_the_seed_arithmetic_task_scores_replies() -> None:
    task = Arithmetic({"question": "What is 2+3?", "answer": "5"})
    run = RunContext(run="r", episode="e", seat="solver")
    first = await task.start(run)
    assert first.messages() == (Message.user("What is 2+3?"),)
    right = await task.respond(run, Message.assistant(" 5\n"))
    wrong = await task.respond(run, Message.assistant("6"))
    assert isinstance(right, End) and right.reward == 1.0
    assert isinstance(wrong, End) and wrong.reward == 0.0
    assert isinstance(right, Observation)
