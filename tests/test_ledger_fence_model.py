"""A hypothesis state machine: leases and fences against a model of what they must allow.

The model: a lease grant succeeds when nobody holds a live lease or the claimant already holds it and
presents its secret (one that only repeats the holder's name gets nothing), and bumps the epoch; an append
under epoch e commits iff e is the lease's current epoch and it carries the secret that epoch was granted
for (an impostor naming the epoch gets nothing); the retry of a committed append always succeeds without
writing; the stream is exactly the committed appends, gap-free.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from rollout.ledger import Lease, Ledger, NewEvent, StaleFenceError

RESOURCES = ("r0", "r1")
HOLDERS = ("h0", "h1", "h2")
SECRETS = {holder: f"{holder}-secret-{'s' * 32}" for holder in HOLDERS}
IMPOSTOR = "an-impostor-who-knows-only-the-name-" + "x" * 32


@dataclass
class LeaseModel:
    holder: str
    epoch: int
    live: bool


@dataclass
class World:
    leases: dict[str, LeaseModel] = field(default_factory=dict[str, LeaseModel])
    granted: dict[tuple[str, str], list[int]] = field(default_factory=dict[tuple[str, str], list[int]])
    committed: dict[str, list[tuple[str, int]]] = field(default_factory=dict[str, list[tuple[str, int]]])


class LeaseAndFenceMachine(RuleBasedStateMachine):
    url = ""  # set by the test to the session ledger's URL

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"model/{uuid.uuid4().hex[:10]}"
        self.loop = asyncio.new_event_loop()
        self.ledger = self.loop.run_until_complete(Ledger.connect(self.url, max_size=1))
        self.world = World()
        self.counter = 0

    def teardown(self) -> None:
        self.loop.run_until_complete(self.ledger.close())
        self.loop.close()

    def resource(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def stream(self, name: str) -> str:
        return f"{self.prefix}/{name}/stream"

    @rule(resource=st.sampled_from(RESOURCES), holder=st.sampled_from(HOLDERS), impostor=st.booleans())
    def claim(self, resource: str, holder: str, impostor: bool) -> None:
        secret = IMPOSTOR if impostor else SECRETS[holder]
        lease = self.loop.run_until_complete(
            self.ledger.claim(self.resource(resource), holder, ttl_s=600, secret=secret)
        )
        current = self.world.leases.get(resource)
        claimant = f"{holder} with {secret}"  # who a lease is: its holder's name and secret together
        grantable = current is None or not current.live or current.holder == claimant
        assert (lease is not None) == grantable
        if lease is not None:
            expected_epoch = 1 if current is None else current.epoch + 1
            assert lease.epoch == expected_epoch
            self.world.leases[resource] = LeaseModel(claimant, lease.epoch, live=True)
            if impostor:  # the rules below act as the real holders, with their secrets
                return
            self.world.granted.setdefault((resource, holder), []).append(lease.epoch)

    @rule(resource=st.sampled_from(RESOURCES))
    def time_passes(self, resource: str) -> None:
        """The lease's holder stops renewing and its lease runs out."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "UPDATE lease SET expires_at = now() - interval '1 second' WHERE resource = %s",
                (self.resource(resource),),
            )
        if resource in self.world.leases:
            self.world.leases[resource].live = False

    @rule(resource=st.sampled_from(RESOURCES), holder=st.sampled_from(HOLDERS), data=st.data())
    def renew_or_release(self, resource: str, holder: str, data: st.DataObject) -> None:
        epochs = self.world.granted.get((resource, holder))
        if not epochs:
            return
        epoch = data.draw(st.sampled_from(epochs))
        lease = Lease(
            self.resource(resource), holder, epoch, expires_at=datetime.now(UTC), secret=SECRETS[holder]
        )
        current = self.world.leases[resource]
        if data.draw(st.booleans()):
            renewed = self.loop.run_until_complete(self.ledger.renew(lease, ttl_s=600))
            assert (renewed is not None) == (current.epoch == epoch)
            if renewed is not None:
                current.live = True
        else:
            self.loop.run_until_complete(self.ledger.release(lease))
            if current.epoch == epoch:
                current.live = False

    @rule(resource=st.sampled_from(RESOURCES), holder=st.sampled_from(HOLDERS), data=st.data())
    def append(self, resource: str, holder: str, data: st.DataObject) -> None:
        epochs = self.world.granted.get((resource, holder))
        if not epochs:
            return
        epoch = data.draw(st.sampled_from(epochs), label="writer epoch")
        self.counter += 1
        key = f"{holder}-{self.counter}"
        # An impostor names the holder's epoch (every worker reads it) without the holder's secret.
        impostor = data.draw(st.booleans(), label="impostor")
        lease = Lease(
            resource=self.resource(resource),
            holder=holder,
            epoch=epoch,
            expires_at=datetime.now(UTC),
            secret=IMPOSTOR if impostor else SECRETS[holder],
        )
        expected_ok = self.world.leases[resource].epoch == epoch and not impostor
        try:
            self.loop.run_until_complete(
                self.ledger.append(
                    self.stream(resource), [NewEvent(key, "Step", {"epoch": epoch})], fence=lease.fence
                )
            )
        except StaleFenceError:
            assert not expected_ok, f"epoch {epoch} is current but its append was refused"
        else:
            assert expected_ok, f"stale epoch {epoch} appended (lease at {self.world.leases[resource].epoch})"
            self.world.committed.setdefault(resource, []).append((key, epoch))

    @rule(resource=st.sampled_from(RESOURCES), data=st.data())
    def retry_a_committed_append(self, resource: str, data: st.DataObject) -> None:
        committed = self.world.committed.get(resource)
        if not committed:
            return
        key, epoch = data.draw(st.sampled_from(committed))
        fence = Lease(
            resource=self.resource(resource), holder="?", epoch=epoch, expires_at=datetime.now(UTC)
        ).fence
        (again,) = self.loop.run_until_complete(
            self.ledger.append(self.stream(resource), [NewEvent(key, "Step", {"epoch": epoch})], fence=fence)
        )
        assert not again.appended

    @invariant()
    def streams_hold_exactly_the_committed_appends(self) -> None:
        for resource in RESOURCES:
            events = self.loop.run_until_complete(self.ledger.read(self.stream(resource)))
            expected = self.world.committed.get(resource, [])
            assert [e.key for e in events] == [key for key, _ in expected]
            assert [e.seq for e in events] == list(range(1, len(expected) + 1))


def test_leases_and_fences_match_the_model(ledger_url: str) -> None:
    LeaseAndFenceMachine.url = ledger_url
    run_state_machine_as_test(
        LeaseAndFenceMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
