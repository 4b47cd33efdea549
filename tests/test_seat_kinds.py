"""Which seats train: built-in and command seats train their policy; a pinned checkpoint or an external model
does not. An environment's `trains` judges each conversation of a seat; an external model cannot share a
policy with seats that train."""

from __future__ import annotations

import pytest
from temporalio.converter import default as default_converter

from rollout.activities.agent_loop import TaskFailed
from rollout.activities.conversations import conversations, untrained
from rollout.environment import AgentSeatSpec, Dataset, Environment, SandboxSpec
from rollout.ledger.payloads import SampledTurn
from rollout.security.isolation import JailLimits
from rollout.workflows.episode_types import AgentInput, EnvironmentInfo
from rollout.workflows.run import trained_policies
from tests.example_envs import Coin


def environment(*agents: AgentSeatSpec, trains=None) -> Environment:
    return Environment("seats", lambda parameters, agent: Coin(), Dataset([{}]), agents=agents, trains=trains)


def turn(
    segment: str, *, opening: dict[str, object] | None = None, aborted: str | None = None
) -> SampledTurn:
    return SampledTurn(
        seat="s",
        run="r",
        episode="e",
        agent="solver",
        policy="r/default",
        turn_index=0,
        fingerprint="f",
        segment_id=segment,
        prompt_prefix_len=0,
        prompt_ids_delta=(1,),
        completion_ids=(2,),
        completion_logprobs=(-0.5,),
        checkpoint="base",
        checkpoint_version=0,
        engine="e",
        admitted_newest=0,
        admitted_max_lag=1,
        finish_reason="stop",
        stop_sequence=None,
        reply={"role": "assistant", "text": "x"},
        parse_failures=(),
        n_messages=2,
        messages_sha="m",
        tools_sha="t",
        aborted=aborted,
        opening=opening,
    )


def test_command_seats_train_and_pinned_or_external_model_seats_do_not() -> None:
    info = EnvironmentInfo(
        reference="x:y",
        name="seats",
        agents=[
            AgentSeatSpec("claude", policy="coder", command=("claude", "-p")),
            AgentSeatSpec("builtin", policy="coder"),
            AgentSeatSpec("old", policy="coder", checkpoint="coder-step000003"),
            AgentSeatSpec("judge", policy="judge", model="anthropic/claude-sonnet-4-5"),
        ],
        group_size=2,
        max_turns=4,
        replayable=False,
    )
    assert trained_policies(info) == ["coder"]
    assert info.external_models() == {"judge": "anthropic/claude-sonnet-4-5"}


def test_an_environments_seats_and_sandbox_cross_temporal_as_they_are() -> None:
    """Workflow code gets the environment's own `AgentSeatSpec`s and `SandboxSpec`: Temporal's JSON converter
    gives them back equal (tuples, the limits, a network of one entry or several)."""
    command = AgentSeatSpec("claude", policy="coder", command=("claude", "-p"), readable=("/opt/x",))
    model = AgentSeatSpec("judge", policy="judge", model="anthropic/claude-sonnet-4-5")
    sandboxes = [
        SandboxSpec("shell", seats=2, limits=JailLimits(processes=64), network=("gateway", "db.local:5432")),
        SandboxSpec("shell", seats=2, network="gateway"),
        None,
    ]
    converter = default_converter().payload_converter
    for sandbox in sandboxes:
        info = EnvironmentInfo("x:y", "seats", [command, model], 2, 4, replayable=False, sandbox=sandbox)
        given = AgentInput("r", "e", 0, info, command)
        (back,) = converter.from_payloads(converter.to_payloads([given]), [AgentInput])
        assert back == given
        assert back.agent.command == ("claude", "-p") and back.environment.agents[1].model is not None


def test_an_external_model_seat_is_checked_when_the_environment_is_made() -> None:
    with pytest.raises(ValueError, match="both a model and a checkpoint"):
        environment(AgentSeatSpec("judge", model="openai/gpt-5", checkpoint="c"))
    with pytest.raises(ValueError, match="give it a policy of its own"):
        environment(AgentSeatSpec("solver"), AgentSeatSpec("judge", model="openai/gpt-5"))
    made = environment(AgentSeatSpec("solver"), AgentSeatSpec("judge", policy="judge", model="openai/gpt-5"))
    assert [a.trainable for a in made.agents] == [True, False]


def test_conversations_group_a_seats_turns_by_segment_and_the_environment_keeps_some_out() -> None:
    task = {"model": "policy", "tools": ["Bash"], "system": "You are Claude Code", "first_user": "fix it"}
    title = {"model": "haiku", "tools": [], "system": "Write a title", "first_user": "fix it"}
    turns = [
        turn("a", opening=task),
        turn("a"),
        turn("b", opening=title),
        turn("c", opening=task, aborted="stream aborted: ConnectionError"),
    ]
    found = conversations(turns)
    assert [(c.segment_id, c.turns, c.model, c.tools) for c in found] == [
        ("a", 2, "policy", ("Bash",)),
        ("b", 1, "haiku", ()),
    ], "an aborted turn is no conversation"
    assert untrained(environment(AgentSeatSpec("solver")), turns) == [], (
        "every conversation trains by default"
    )
    picky = environment(AgentSeatSpec("solver"), trains=lambda c: bool(c.tools))
    assert untrained(picky, turns) == ["b"]
    broken = environment(AgentSeatSpec("solver"), trains=lambda c: 1 / 0 > 0)
    with pytest.raises(TaskFailed, match="ZeroDivisionError"):
        untrained(broken, turns)
