"""A command seat played on a command host (the `command` sandbox kind, rollout.sandbox.command_host) rather
than in the runner's own jail: the runner keeps the Task, its keys and its files; the policy's process tree
runs on the host.

Contract:
- `remote_seat(pool, kind, holder, program=, gateway_url=, token=, readable=, packages=, timeout_s=)` claims a
  host of `kind` from the pool (holder `holder`: one claim per command, never shared), opens the claim with
  network `gateway` (the seat's own routes, nothing else), keeps the claim renewed while the block runs and
  releases it after. It yields a `RemoteSeat`; `NoSandboxFree` when no host is free within `wait_s`.
- `RemoteSeat` has what rollout.sandbox.seat_jail's `SeatJail` has for a Task: `workdir` (a fresh folder on
  the runner that the Task's `prepare` fills, and that holds the command's workspace after `run`), `inside`
  (`/sandbox`) and `base_url` (the seat's gateway as the jailed command reaches it). `run(argv, env=, cwd=,
  timeout_s=, ...)` sends the folder and the command to the host, waits for the command to end, and puts
  the workspace the host sends back into `workdir` (rollout.sandbox.archive: entries that would lead out of
  it are left out), empty when it was over the host's limit or holds more than the command's disk. The
  host's refusal (a program it does not have, a malformed order) raises `SandboxActionError`; a claim lost
  meanwhile `SandboxSuperseded`; a host that cannot jail `SandboxLost`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rollout.harness import SandboxSeat
from rollout.sandbox.archive import pack, unpack
from rollout.sandbox.claims import SandboxClaim, SandboxPool
from rollout.sandbox.client import SandboxClient
from rollout.sandbox.jail import INSIDE
from rollout.sandbox.keys import claim_secret
from rollout.sandbox.limits import COMMAND_LIMITS
from rollout.sandbox.seat_jail import agent_workdir, inside_port
from rollout.security.bounded_process import ProcessOutcome

log = logging.getLogger(__name__)

CLAIM_TTL_S = 60.0
ANSWER_GRACE_S = 120.0  # beyond the command's own limit: the host packs and sends its workspace


@dataclass
class RemoteSeat:
    client: SandboxClient
    program: str
    readable: tuple[str, ...]
    packages: tuple[str, ...]
    workdir: Path
    base_url: str
    inside: str = INSIDE

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        timeout_s: float,
        max_output_bytes: int,
        keep: Literal["head", "tail"] = "tail",
    ) -> ProcessOutcome:
        files = await asyncio.to_thread(pack, self.workdir)
        answer = await self.client.act(
            {
                "program": self.program,
                "argv": list(argv),
                "env": dict(env),
                "cwd": cwd,
                "timeout_s": timeout_s,
                "readable": list(self.readable),
                "packages": list(self.packages),
                "files": base64.b64encode(files).decode(),
            }
        )
        shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        if answer.get("files"):
            await self._take_back(str(answer["files"]))
        output = str(answer.get("output", ""))
        kept = output.encode()[-max_output_bytes:] if keep == "tail" else output.encode()[:max_output_bytes]
        exit_code = answer.get("exit_code")
        return ProcessOutcome(
            exit_code=exit_code if isinstance(exit_code, int) else None,
            output=kept.decode(errors="replace"),
            truncated=bool(answer.get("truncated")) or len(kept) < len(output.encode()),
            timed_out=bool(answer.get("timed_out")),
        )

    async def _take_back(self, files: str) -> None:
        """The workspace the host sent, into `workdir`: what leads out of it left out, none of it when it
        holds more than the command's disk (`COMMAND_LIMITS`), more entries than a workspace has, or is not
        an archive: the command's doing, so the Task's `finish` then finds an empty folder."""
        try:
            packed = base64.b64decode(files, validate=True)
            left_out = await asyncio.to_thread(
                unpack, packed, self.workdir, limit_bytes=COMMAND_LIMITS.disk_bytes
            )
        except ValueError as error:  # binascii.Error, ArchiveTooLarge, UnsafeArchive
            shutil.rmtree(self.workdir)
            self.workdir.mkdir(parents=True)
            log.warning("the command host's workspace was not taken back: %s", error)
            return
        if left_out:
            log.info(
                "the command host's workspace came back without %d entries: %s", len(left_out), left_out[:5]
            )


@contextlib.asynccontextmanager
async def remote_seat(
    pool: SandboxPool,
    kind: str,
    holder: str,
    *,
    program: str,
    gateway_url: str,
    token: str,
    readable: Sequence[str] = (),
    packages: Sequence[str] = (),
    timeout_s: float,
    wait_s: float = 300,
) -> AsyncIterator[RemoteSeat]:
    key = pool.key
    if key is None:
        raise ValueError("a remote seat's pool needs the sandbox key its claims are proven with")

    def seat_of(claim: SandboxClaim) -> SandboxSeat:
        box = claim.sandbox
        return SandboxSeat(
            address=box.address,
            kind=box.kind,
            name=box.name,
            epoch=claim.epoch,
            seat=0,
            holder=holder,
            secret=claim_secret(key, box.kind, box.name, claim.epoch, holder),
            gateway_url=f"{gateway_url.rstrip('/')}/s/{token}",
        )

    async def open_claim(claim: SandboxClaim) -> None:
        async with SandboxClient(seat_of(claim), timeout_s=60) as client:
            await client.open(network=["gateway"])

    claim = await pool.claim(kind, 1, holder, ttl_s=CLAIM_TTL_S, wait_s=wait_s, open=open_claim)
    workdir = agent_workdir()
    workdir.mkdir(parents=True)
    renewing = asyncio.create_task(_keep_claimed(pool, claim))
    try:
        async with SandboxClient(seat_of(claim), timeout_s=timeout_s + ANSWER_GRACE_S) as client:
            yield RemoteSeat(
                client=client,
                program=program,
                readable=tuple(map(str, readable)),
                packages=tuple(packages),
                workdir=workdir,
                base_url=f"http://127.0.0.1:{inside_port(gateway_url)}",
            )
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        shutil.rmtree(workdir, ignore_errors=True)
        await pool.release(claim)


async def _keep_claimed(pool: SandboxPool, claim: SandboxClaim) -> None:
    while True:
        await asyncio.sleep(CLAIM_TTL_S / 3)
        renewed = await pool.renew(claim, CLAIM_TTL_S)
        if renewed is None:
            return  # lost: the host refuses the next act under the old epoch (SandboxSuperseded)
        claim = renewed
