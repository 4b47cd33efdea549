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
from rollout.ledger.queries import held_sandbox
from rollout.sandbox.claims import SandboxPool, SandboxRegistration
from rollout.sandbox.keys import grant_signature, kind_key
from rollout.workflows.episode_types import AgentAttempt, AgentInput, EnvironmentInfo, SandboxGrant

SANDBOX_KEY = b"s" * 32


def _grant(address: str, holder: str, key: bytes = SANDBOX_KEY, workflow_id: str = "claimer") -> SandboxGrant:
    grant = SandboxGrant("shell", "box-1", address, epoch=3, holder=holder, workflow_id=workflow_id)
    return replace(grant, signature=grant_signature(key, "shell", "box-1", address, 3, holder, workflow_id))


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
    # This episode's own grant, copied out of its history into a workflow of the attacker's.
    attackers = ActivityEnvironment()
    attackers.info = replace(attackers.info, workflow_id="a-workflow-of-the-attackers")
    with pytest.raises(ApplicationError, match="claimed by another workflow"):
        await attackers.run(runner.play_agent, _attempt(run, "g000000-0", _grant(address, holder)))
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody called the forger's address, with a claim's secret or otherwise
    listener.close()


async def test_a_grant_copied_out_of_history_ends_no_claim(ledger: Ledger) -> None:
    """A real, signed grant is in the claiming workflow's history, which anyone who reaches Temporal reads.
    Replayed from a workflow of their own (another id: while the episode runs, Temporal starts no other
    workflow with its id), it neither releases nor renews the claim; from the run that claimed it, it does."""
    runner = RunnerActivities(
        ledger, gateway_url="http://127.0.0.1:9", seat_secret=b"g" * 32, sandbox_key=SANDBOX_KEY
    )
    kind = f"shell#replay-{uuid.uuid4().hex[:6]}"
    holder = f"replay-{uuid.uuid4().hex[:6]}/g000000-0"
    pool = SandboxPool(ledger, SANDBOX_KEY)
    registration = SandboxRegistration(kind=kind, name="box-1", address="http://127.0.0.1:9", seats=1)
    async with pool.hosting(registration, ttl_s=60, kind_secret=kind_key(SANDBOX_KEY, kind)):
        claim = await pool.claim(kind, 1, holder, ttl_s=60, wait_s=5)
        grant = _grant(registration.address, holder, workflow_id="the-claimer")
        grant = replace(grant, kind=kind, epoch=claim.epoch)
        grant = replace(grant, signature=_signed_again(grant))
        replayer, claimer = ActivityEnvironment(), ActivityEnvironment()
        replayer.info = replace(replayer.info, workflow_id="a-workflow-of-the-attackers")
        claimer.info = replace(claimer.info, workflow_id="the-claimer")
        for attack in (
            replayer.run(runner.release_sandbox, grant),
            replayer.run(runner.renew_sandbox, grant, 30.0),
        ):
            with pytest.raises(ApplicationError, match="claimed by another workflow"):
                await attack
        assert await held_sandbox(ledger, kind, holder) is not None, "the claim is still its episode's"
        assert await claimer.run(runner.renew_sandbox, grant, 30.0) is True
        await claimer.run(runner.release_sandbox, grant)
        assert await held_sandbox(ledger, kind, holder) is None


def _signed_again(grant: SandboxGrant) -> str:
    return grant_signature(
        SANDBOX_KEY, grant.kind, grant.name, grant.address, grant.epoch, grant.holder, grant.workflow_id
    )
