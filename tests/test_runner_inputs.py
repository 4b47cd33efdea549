"""What the runner does with a sandbox grant it did not make: anyone who reaches Temporal (no key asked) can
start an `AgentWorkflow`, or a claim's renew or release, naming any sandbox address. The runner derives the
claim's secret from the sandbox key and would send it there; it must act only on a grant a runner of this
stack signed, for the episode it plays. Each attack below runs the real activity, as Temporal would."""

from __future__ import annotations

import socket
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from coding.environment import environment as coding
from rollout.activities.runner import RunnerActivities
from rollout.ledger import Ledger
from rollout.sandbox.keys import grant_signature
from rollout.workflows.episode_types import AgentAttempt, AgentInput, EnvironmentInfo, SandboxGrant

SANDBOX_KEY = b"s" * 32


def _grant(address: str, holder: str, key: bytes = SANDBOX_KEY) -> SandboxGrant:
    grant = SandboxGrant(kind="shell", name="box-1", address=address, epoch=3, holder=holder)
    return replace(grant, signature=grant_signature(key, "shell", "box-1", address, 3, holder))


def _attempt(run: str, episode: str, grant: SandboxGrant) -> AgentAttempt:
    info = EnvironmentInfo(
        reference="coding.environment:environment",
        name="coding",
        agents=list(coding.agents),
        group_size=coding.group_size,
        max_turns=coding.max_turns,
        replayable=False,
        sandbox=coding.sandbox,
    )
    given = AgentInput(run, episode, 0, info, coding.agents[0], sandbox=grant, sandbox_seat=0)
    return AgentAttempt(given, 1, f"{run}/{episode}/solver")


async def test_a_forged_or_borrowed_grant_sends_nothing_anywhere(ledger: Ledger, tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    address = f"http://127.0.0.1:{listener.getsockname()[1]}"
    runner = RunnerActivities(
        ledger, gateway_url="http://127.0.0.1:9", seat_secret=b"g" * 32, sandbox_key=SANDBOX_KEY
    )
    run = f"forged-{uuid.uuid4().hex[:6]}"
    holder = f"{run}/g000000-0"
    unsigned = replace(_grant(address, holder), signature="")
    other_key = _grant(address, holder, key=b"x" * 32)
    borrowed = _grant(address, f"{run}/g000001-0")  # a real grant of another episode
    activities = ActivityEnvironment()
    for forged in (unsigned, other_key, borrowed):
        with pytest.raises(ApplicationError, match="not made by a runner of this stack") as refused:
            await activities.run(runner.play_agent, _attempt(run, "g000000-0", forged))
        assert refused.value.type == "SandboxRefused" and refused.value.non_retryable
    for forged in (unsigned, other_key):
        with pytest.raises(ApplicationError, match="not made by a runner of this stack"):
            await activities.run(runner.release_sandbox, forged)
        with pytest.raises(ApplicationError, match="not made by a runner of this stack"):
            await activities.run(runner.renew_sandbox, forged, 30.0)
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody called the forger's address, with a claim's secret or otherwise
    listener.close()
