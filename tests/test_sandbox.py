"""Sandboxes: the shell kind's limits, the server's fence, and the pool's claims on a real ledger (Postgres),
including a claim whose holder process was SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import sandbox_host_lease, sandbox_pool_stream
from rollout.sandbox import NoSandboxFree, SandboxClient, SandboxPool, SandboxSuperseded
from rollout.sandbox.client import SandboxActionError
from rollout.sandbox.hosting import hosted_sandbox
from rollout.sandbox.keys import host_proof, kind_key
from rollout.sandbox.shell import MAX_OUTPUT_BYTES, ShellWorld
from tests.sandboxutil import SANDBOX_KEY, claimed_seat


async def test_the_shell_runs_commands_in_its_directory_within_limits(tmp_path: Path) -> None:
    world = ShellWorld(tmp_path / "box", seats=2)
    made = await world.act(0, {"command": "echo hello > note.txt && cat note.txt && echo oops >&2; exit 3"})
    assert made == {"exit_code": 3, "output": "hello\noops\n", "truncated": False, "timed_out": False}
    assert (await world.act(1, {"command": "cat note.txt"}))["output"] == "hello\n", (
        "seats share one directory"
    )
    started = time.monotonic()
    slow = await world.act(0, {"command": "sleep 30 & sleep 30; echo never", "timeout_s": 0.5})
    assert slow["timed_out"] and "never" not in slow["output"] and time.monotonic() - started < 5
    loud = await world.act(0, {"command": "yes 0123456789 | head -c 200000"})
    assert loud["truncated"] and len(loud["output"]) == MAX_OUTPUT_BYTES and loud["exit_code"] == 0
    await world.reset()
    assert list(world.workdir.iterdir()) == [], "a new claim starts from a clean directory"
    with pytest.raises(ValueError, match="command"):
        await world.act(0, {"cmd": "ls"})
    await world.close()


async def test_a_newer_claim_fences_off_the_older_holder(ledger: Ledger, tmp_path: Path) -> None:
    name = f"fence-{uuid.uuid4().hex[:6]}"
    async with hosted_sandbox(
        ledger, "shell", name, seats=2, workdir=tmp_path / name, key=kind_key(SANDBOX_KEY, "shell")
    ) as box:
        old = claimed_seat(box.address, "shell", name, epoch=1, seat=0, holder="old")
        new = claimed_seat(box.address, "shell", name, epoch=2, seat=1, holder="new")
        async with SandboxClient(old) as zombie, SandboxClient(new) as holder:
            await zombie.open()
            await zombie.act({"command": "touch left-by-old"})
            await holder.open()
            assert (await holder.act({"command": "ls"}))["output"] == "", "the new claim reset the world"
            with pytest.raises(SandboxSuperseded, match="epoch 1"):
                await zombie.act({"command": "touch late"})
            with pytest.raises(SandboxSuperseded):
                await zombie.open()
            # Without the claim's secret, with another's, from a web page, to a foreign Host or not as JSON:
            # refused.
            async with httpx.AsyncClient(base_url=box.address) as anyone:
                act = {"epoch": 2, "holder": "new", "seat": 0, "action": {"command": "touch forged"}}
                assert (await anyone.post("/act", json=act)).status_code == 401
                forged = {"authorization": f"Bearer {old.secret}"}
                assert (await anyone.post("/act", json=act, headers=forged)).status_code == 403
                assert (
                    await anyone.post("/open", json={"epoch": 3, "holder": "x"}, headers=forged)
                ).status_code == 403
                page = {"authorization": f"Bearer {new.secret}", "origin": "http://evil.test"}
                assert (await anyone.post("/act", json=act, headers=page)).status_code == 403
                rebound = {"authorization": f"Bearer {new.secret}", "host": "evil.test"}
                assert (await anyone.post("/act", json=act, headers=rebound)).status_code == 421
                as_text = {"authorization": f"Bearer {new.secret}", "content-type": "text/plain"}
                posted = await anyone.post("/act", content=json.dumps(act), headers=as_text)
                assert posted.status_code == 415 and "application/json" in posted.json()["error"], posted.text
                for missing in (await anyone.get("/nothing"), await anyone.get("/act")):
                    assert missing.status_code in (404, 405) and isinstance(missing.json()["error"], str)
                health = (await anyone.get("/health")).json()
                assert health == {"kind": "shell", "name": name, "seats": 2}, "no epoch handed out"
            assert "forged" not in (await holder.act({"command": "ls"}))["output"]
            with pytest.raises(SandboxActionError, match=re.escape("seats 0..1")):
                await SandboxClient(
                    claimed_seat(box.address, "shell", name, epoch=2, seat=5, holder="new")
                ).act({"command": "ls"})


async def test_claims_are_one_episode_per_sandbox_and_idempotent_by_holder(
    ledger: Ledger, tmp_path: Path
) -> None:
    kind = f"shell#{uuid.uuid4().hex[:6]}"  # a pool of its own
    name = "pool-0"
    pool = SandboxPool(ledger, SANDBOX_KEY)
    async with hosted_sandbox(
        ledger, kind, name, seats=4, workdir=tmp_path / name, key=kind_key(SANDBOX_KEY, kind)
    ) as box:
        for forged in (  # what no server writes: a path for a name, credentials or no host in the address
            {"kind": kind, "name": "../../etc", "address": "http://127.0.0.1:9", "seats": 4},
            {"kind": kind, "name": "forged-1", "address": "http://user:pw@127.0.0.1:9", "seats": 4},
            {"kind": kind, "name": "forged-2", "address": "file:///etc/passwd", "seats": 4},
            {"kind": kind, "name": "forged-3", "address": "http://127.0.0.1:9", "seats": "4"},
            # Another host re-registering the live host's name elsewhere, bigger: it moves nothing.
            {"kind": kind, "name": name, "address": "http://127.0.0.1:9", "seats": 64},
        ):
            event = NewEvent(f"forged/{forged['name']}", Kind.SANDBOX_REGISTERED, forged)
            await ledger.append_one(sandbox_pool_stream(kind), event)
        # A host lease whose holder says what no server says is not in the pool either.
        assert await ledger.claim(sandbox_host_lease(kind, "forged-4"), "4@file:///etc/passwd", 30)
        # Nor is a host of another kind (a `shell` host the policy took over, joining a `command` pool to be
        # sent seat tokens): it proves its place with its own kind's key, not this one's.
        for name_, proof in (
            (
                "forged-5",
                host_proof(kind_key(SANDBOX_KEY, "shell"), kind, "forged-5", 8, "http://127.0.0.1:9"),
            ),
            ("forged-6", ""),
        ):
            holder = f"8@http://127.0.0.1:9#{proof}" if proof else "8@http://127.0.0.1:9"
            assert await ledger.claim(sandbox_host_lease(kind, name_), holder, 30)
        registered = await pool.registered(kind)
        assert [(s.name, s.seats, s.address) for s in registered] == [(name, 4, box.address)]
        first = await pool.claim(kind, 2, "run/a", ttl_s=30, wait_s=1)
        again = await pool.claim(kind, 2, "run/a", ttl_s=30, wait_s=1)
        assert again.sandbox == first.sandbox and again.epoch > first.epoch, (
            "a retried claim keeps its sandbox"
        )
        # A writer repeating the holder's name, without the key its lease secret derives from, gets nothing.
        with pytest.raises(NoSandboxFree, match="claimed by other episodes"):
            await SandboxPool(ledger).claim(kind, 2, "run/a", ttl_s=30, wait_s=0.5, poll_s=0.1)
        with pytest.raises(NoSandboxFree, match="is registered"):  # it cannot tell the pool's hosts either
            await SandboxPool(ledger, b"another key").claim(
                kind, 2, "run/a", ttl_s=30, wait_s=0.5, poll_s=0.1
            )
        with pytest.raises(NoSandboxFree, match="claimed by other episodes"):
            await pool.claim(kind, 2, "run/b", ttl_s=30, wait_s=0.5, poll_s=0.1)
        with pytest.raises(NoSandboxFree, match=re.escape(f"rollout sandbox serve --kind {kind} --seats 8")):
            await pool.claim(kind, 8, "run/c", wait_s=0.2, poll_s=0.1)
        await pool.release(again)
        taken = await pool.claim(kind, 2, "run/b", ttl_s=30, wait_s=1)
        assert taken.epoch > again.epoch
        await pool.release(taken)
    assert name not in [s.name for s in await pool.registered(kind)], (
        "a stopped server leaves the pool at once"
    )


HOLDER = """
import asyncio, sys
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import sandbox_pool_stream
from rollout.sandbox import SandboxPool

async def main():
    async with await Ledger.connect(sys.argv[1]) as ledger:
        claim = await SandboxPool(ledger).claim(sys.argv[2], 1, "doomed-holder", ttl_s=2, wait_s=5)
        print(claim.sandbox.name, claim.epoch, flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_claim_whose_holder_died_expires_and_the_sandbox_is_claimed_again(
    ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    kind = f"rollout.sandbox.shell:ShellWorld#{uuid.uuid4().hex[:6]}"  # a pool of its own
    name = "leak-0"
    async with hosted_sandbox(
        ledger, kind, name, seats=1, workdir=tmp_path / name, key=kind_key(SANDBOX_KEY, kind)
    ):
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLDER, ledger_url, kind, stdout=asyncio.subprocess.PIPE
        )
        assert holder.stdout is not None
        claimed_name, epoch = (await holder.stdout.readline()).decode().split()
        assert claimed_name == name
        os.kill(holder.pid, signal.SIGKILL)
        await holder.wait()
        pool = SandboxPool(ledger)
        with pytest.raises(NoSandboxFree):
            await pool.claim(kind, 1, "next-episode", wait_s=0.3, poll_s=0.1)
        started = time.monotonic()
        claim = await pool.claim(kind, 1, "next-episode", ttl_s=30, wait_s=10, poll_s=0.2)
        assert claim.sandbox.name == name and claim.epoch > int(epoch)
        assert time.monotonic() - started < 4, "the dead holder's claim lapses after its 2 s ttl"
        await pool.release(claim)
