"""The sandbox pool: sandboxes register in the ledger; an episode claims one, fenced, with expiry and
heartbeat.

Contract:
- A sandbox server registers itself on `sandboxes/{kind}` (`SandboxRegistered`: name, address, seats; a
  record for people and tools) and, while it serves, holds the host lease `sandbox-host/{kind}/{name}`
  (holder: `SEATS@ADDRESS`), renewing it. The pool is the live host leases, as their holders say: a server
  that died drops out once its host lease expires; one that stops releases it at once. A registration cannot
  move or resize another host (only the lease's holder, who holds its secret, says where it is); a host lease
  whose holder is a bare address (a host from before) takes its seats from the name's latest registration
  at that address.
- A claim is a ledger lease on `sandbox/{kind}/{name}` held by the episode (`holder` = `{run}/{episode}`): one
  episode per sandbox at a time, its agents taking seats 0..N-1, so agents on different machines share one
  world. Every grant bumps the lease's epoch; the sandbox server resets the world for a new epoch and rejects
  actions under an older one, so a holder that lost its claim (a zombie) can no longer act.
- A host read from the ledger is used only when its name is a plain name, its address an `http://` or
  `https://` URL with a host and no credentials, and its seats a positive count; any other is skipped (a
  claim's secret is sent to that address).
- `claim` is idempotent by holder: a holder that already has a live claim of the kind gets that sandbox again
  (a retried claim activity does not take a second sandbox), when the pool holds the sandbox key its claim's
  lease secret derives from (`lease_secret`); a writer repeating the holder's name without it gets nothing.
  Otherwise it tries the sandboxes in an order spread by holder, and waits (polling) while none is free;
  after `wait_s` it raises `NoSandboxFree`, saying what to do. `open` (the caller's first contact with the
  server) runs inside the claim: a server that does not answer gets its claim released and the next sandbox
  is tried; one that refuses (`open` raised anything else) gets it released too, and the error is raised.
- The holder renews its claim well inside `ttl_s`; a claim nobody renews (its holder died) expires, and the
  sandbox is claimed again. `release` frees it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from rollout.ledger import Kind, Lease, Ledger, NewEvent
from rollout.ledger.queries import held_sandbox, live_sandbox_hosts
from rollout.ledger.streams import sandbox_host_lease, sandbox_lease, sandbox_pool_stream
from rollout.records.sandboxes import SandboxRegistered
from rollout.sandbox.keys import host_proof, kind_key, lease_secret, same_secret


class NoSandboxFree(RuntimeError):
    """No sandbox of the kind could be claimed in time."""


@dataclass(frozen=True)
class SandboxRegistration:
    kind: str
    name: str
    address: str
    seats: int


@dataclass(frozen=True)
class SandboxClaim:
    sandbox: SandboxRegistration
    lease: Lease

    @property
    def epoch(self) -> int:
        return self.lease.epoch


class SandboxNameTaken(RuntimeError):
    """Another live server already serves a sandbox of this kind under this name."""


class SandboxPool:
    def __init__(self, ledger: Ledger, key: bytes | None = None) -> None:
        self.ledger = ledger
        self.key = key  # the sandbox key: episodes' claim leases take their secrets from it

    def lease_secret(self, resource: str, holder: str) -> str | None:
        """The secret of `holder`'s lease on `resource`, the same in every runner sharing the key; None (a
        random one, this process's alone) without a key."""
        return lease_secret(self.key, resource, holder) if self.key is not None else None

    async def register(self, sandbox: SandboxRegistration) -> None:
        registered = SandboxRegistered(sandbox.kind, sandbox.name, sandbox.address, sandbox.seats)
        key = f"{sandbox.name}@{sandbox.address}/{sandbox.seats}"
        await self.ledger.append_one(
            sandbox_pool_stream(sandbox.kind),
            NewEvent(key, Kind.SANDBOX_REGISTERED, registered.to_payload()),
        )

    @asynccontextmanager
    async def hosting(
        self, sandbox: SandboxRegistration, *, ttl_s: float = 30, kind_secret: bytes
    ) -> AsyncIterator[None]:
        """Register `sandbox` and keep it in the pool for the block (its server must be answering by then);
        `kind_secret` is its kind's key (rollout.sandbox.keys.load_host_key): its place is proven with it."""
        proof = host_proof(kind_secret, sandbox.kind, sandbox.name, sandbox.seats, sandbox.address)
        # What the pool knows of it: only this host can say it, and only a host of the kind can prove it.
        holder = f"{sandbox.seats}@{sandbox.address}#{proof}"
        host = await self.ledger.claim(sandbox_host_lease(sandbox.kind, sandbox.name), holder, ttl_s)
        if host is None:
            raise SandboxNameTaken(
                f"a {sandbox.kind!r} sandbox named {sandbox.name!r} is already serving: choose another --name"
            )
        await self.register(sandbox)
        renewing = asyncio.create_task(self._keep_hosting(host, ttl_s))
        try:
            yield
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            await self.ledger.release(host)

    async def _keep_hosting(self, host: Lease, ttl_s: float) -> None:
        while True:
            await asyncio.sleep(ttl_s / 3)
            # After a pause longer than the ttl (a stalled machine) the lease lapsed: take it again if still
            # free.
            renewed = await self.ledger.renew(host, ttl_s) or await self.ledger.claim(
                host.resource, host.holder, ttl_s, secret=host.secret
            )
            host = renewed or host

    async def registered(self, kind: str) -> list[SandboxRegistration]:
        """The sandboxes of `kind` in the pool now: those whose host lease is live, as its holder says."""
        hosted = await live_sandbox_hosts(self.ledger, kind)
        latest: dict[str, SandboxRegistration] = {}
        if any(not _SEATS_AT.match(holder) for holder in hosted.values()):
            # A host from before the seats were in its lease: its address is the holder, its seats registered.
            after = 0
            while batch := await self.ledger.read(sandbox_pool_stream(kind), after=after):
                for event in batch:
                    if event.kind == Kind.SANDBOX_REGISTERED and (
                        found := _registration(kind, event.payload)
                    ):
                        latest[found.name] = found
                after = batch[-1].seq
        live = []
        proving = None if self.key is None else kind_key(self.key, kind)
        for name, holder in hosted.items():
            if match := _SEATS_AT.match(holder):
                seats, address, proof = int(match.group(1)), match.group(2), match.group(3)
                if proving is not None and not same_secret(
                    proof or "", host_proof(proving, kind, name, seats, address)
                ):
                    continue  # not a host of this kind (another kind's, or any sandbox login): no seat goes there
                if found := _registration(kind, {"name": name, "address": address, "seats": seats}):
                    live.append(found)
            elif proving is None and (old := latest.get(name)) is not None and old.address == holder:
                live.append(old)
        return sorted(live, key=lambda s: s.name)

    async def claim(
        self,
        kind: str,
        seats: int,
        holder: str,
        *,
        ttl_s: float = 60,
        wait_s: float = 300,
        poll_s: float = 0.5,
        open: Callable[[SandboxClaim], Awaitable[object]] | None = None,
    ) -> SandboxClaim:
        deadline = time.monotonic() + wait_s
        while True:
            fitting = [s for s in await self.registered(kind) if s.seats >= seats]
            for sandbox in await self._claim_order(kind, fitting, holder):
                resource = sandbox_lease(kind, sandbox.name)
                secret = self.lease_secret(resource, holder)
                lease = await self.ledger.claim(resource, holder, ttl_s, secret=secret)
                if lease is None:
                    continue
                claim = SandboxClaim(sandbox, lease)
                try:
                    if open is not None:
                        await open(claim)
                except (OSError, httpx.TransportError):
                    await self.release(claim)  # its server is gone; its host lease lapses soon
                    continue
                except BaseException:
                    await self.release(claim)  # refused: the sandbox is free for another holder
                    raise
                return claim
            if time.monotonic() >= deadline:
                raise NoSandboxFree(_none_free(kind, seats, wait_s, registered=len(fitting)))
            await asyncio.sleep(poll_s)

    async def _claim_order(
        self, kind: str, fitting: list[SandboxRegistration], holder: str
    ) -> list[SandboxRegistration]:
        if not fitting:
            return []
        held = await held_sandbox(self.ledger, kind, holder)
        if held is not None:
            mine = [s for s in fitting if s.name == held]
            if mine:
                return mine
        # Spread holders over the pool, so claims do not all contend for the first sandbox.
        start = zlib.crc32(holder.encode()) % len(fitting)
        return fitting[start:] + fitting[:start]

    async def renew(self, claim: SandboxClaim, ttl_s: float = 60) -> SandboxClaim | None:
        """The claim, extended; None when it expired and someone else holds the sandbox now."""
        lease = await self.ledger.renew(claim.lease, ttl_s)
        return SandboxClaim(claim.sandbox, lease) if lease else None

    async def release(self, claim: SandboxClaim) -> None:
        await self.ledger.release(claim.lease)


# A host lease's holder: SEATS@ADDRESS#PROOF (rollout.sandbox.keys.host_proof; hosts from before gave none).
_SEATS_AT = re.compile(r"^([1-9][0-9]{0,5})@(.+?)(?:#([0-9a-f]{32}))?$")


def _registration(kind: str, payload: Mapping[str, Any]) -> SandboxRegistration | None:
    """The registration a `SandboxRegistered` payload says (of the stream's `kind`, whatever the payload
    says), or None when any of it is not what a server writes."""
    try:
        found = SandboxRegistered.from_payload({**payload, "kind": kind})
    except (TypeError, ValueError):
        return None
    return SandboxRegistration(kind=kind, name=found.name, address=found.address, seats=found.seats)


def _none_free(kind: str, seats: int, wait_s: float, *, registered: int) -> str:
    if registered == 0:
        return (
            f"no sandbox free after waiting {wait_s:g}s: no {kind!r} sandbox with at least {seats} seat(s) is "
            f"registered. Start one with `rollout sandbox serve --kind {kind} --seats {max(seats, 1)}`."
        )
    return (
        f"no sandbox free after waiting {wait_s:g}s: all {registered} {kind!r} sandbox(es) with at least "
        f"{seats} seat(s) are claimed by other episodes. Start more with `rollout sandbox serve --kind {kind}`, "
        "or keep fewer episodes in flight."
    )
