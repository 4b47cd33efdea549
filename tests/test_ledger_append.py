"""Appends against a real Postgres: idempotency, key conflicts, fences, projections, append-only."""

from datetime import UTC, datetime

import psycopg
import pytest

from rollout.ledger import Fence, KeyConflictError, Kind, Ledger, NewEvent, StaleFenceError
from rollout.ledger.queries import find_run
from rollout.ledger.streams import run_stream
from rollout.run.settings import RunSettings


def event(key: str, **payload: object) -> NewEvent:
    return NewEvent(key=key, kind="Test", payload=payload)


async def test_seq_is_gap_free_and_keys_are_idempotent(ledger: Ledger, stream: str) -> None:
    first = await ledger.append(stream, [event("a", n=1), event("b", n=2)])
    assert [(e.seq, e.appended) for e in first] == [(1, True), (2, True)]
    again = await ledger.append(stream, [event("b", n=2), event("c", n=3)])
    assert [(e.seq, e.appended) for e in again] == [(2, False), (3, True)]
    assert [e.key for e in await ledger.read(stream)] == ["a", "b", "c"]
    assert await ledger.head(stream) == 3


async def test_a_key_repeated_in_one_batch_is_appended_once(ledger: Ledger, stream: str) -> None:
    recorded = await ledger.append(stream, [event("a", n=1), event("a", n=1)])
    assert [(e.seq, e.appended) for e in recorded] == [(1, True), (1, False)]
    with pytest.raises(KeyConflictError, match="twice in one append"):
        await ledger.append(stream, [event("z", n=1), event("z", n=2)])


async def test_same_key_with_another_payload_fails_loudly_and_writes_nothing(
    ledger: Ledger, stream: str
) -> None:
    await ledger.append(stream, [event("a", n=1)])
    with pytest.raises(KeyConflictError, match="different payload"):
        await ledger.append(stream, [event("new", n=0), event("a", n=2)])
    assert [e.key for e in await ledger.read(stream)] == ["a"]


async def test_a_takeover_fences_out_the_old_holder(ledger: Ledger, stream: str) -> None:
    resource = f"{stream}/trainer"
    old = await ledger.claim(resource, "worker-1", ttl_s=30)
    assert old is not None and old.epoch == 1
    assert await ledger.claim(resource, "worker-2", ttl_s=30) is None  # live lease held by another
    await ledger.append(stream, [event("step-1")], fence=old.fence)

    await ledger.release(old)
    new = await ledger.claim(resource, "worker-2", ttl_s=30)
    assert new is not None and new.epoch == 2
    # The zombie's new write is rejected even before the successor wrote anything...
    with pytest.raises(StaleFenceError, match="epoch 2"):
        await ledger.append(stream, [event("step-2")], fence=old.fence)
    # ...but the retry of its append that already committed still succeeds (key before fence).
    (retry,) = await ledger.append(stream, [event("step-1")], fence=old.fence)
    assert retry.appended is False and retry.seq == 1
    await ledger.append(stream, [event("step-2")], fence=new.fence)
    assert await ledger.renew(old, ttl_s=30) is None
    assert [e.key for e in await ledger.read(stream)] == ["step-1", "step-2"]


async def test_an_unfenced_writer_cannot_write_to_a_fenced_stream(ledger: Ledger, stream: str) -> None:
    lease = await ledger.claim(f"{stream}/lock", "w", ttl_s=30)
    assert lease is not None
    await ledger.append(stream, [event("a")], fence=lease.fence)
    with pytest.raises(StaleFenceError):
        await ledger.append(stream, [event("b")])
    other = await ledger.claim(f"{stream}/other-lock", "w", ttl_s=30)
    assert other is not None
    with pytest.raises(StaleFenceError, match="fenced by lease"):
        await ledger.append(stream, [event("c")], fence=other.fence)


async def test_a_writer_holding_no_lease_cannot_fence_a_stream_or_match_its_epoch(
    ledger_url: str, ledger: Ledger, stream: str
) -> None:
    """The client sends epoch 0 when it holds no lease; a writer calling the function itself chooses any."""
    resource = f"{stream}/trainer"

    def unfenced(epoch: int, key: str) -> None:
        with psycopg.connect(ledger_url, autocommit=True) as conn:
            conn.execute(
                "SELECT * FROM ledger_append(%s, NULL, %s, NULL, ARRAY[%s], ARRAY['Test'], ARRAY['{}'::jsonb])",
                (stream, epoch, key),
            )

    with pytest.raises(psycopg.Error, match="must carry epoch 0"):
        unfenced(2**62, "fence-everyone-out")
    lease = await ledger.claim(resource, "trainer-1", ttl_s=30)
    assert lease is not None
    await ledger.append(stream, [event("step-1")], fence=lease.fence)  # the real holder still writes
    with pytest.raises(psycopg.Error, match="only its holder appends there"):
        unfenced(0, "forged")
    with pytest.raises(psycopg.Error, match="must carry epoch 0"):
        unfenced(lease.epoch, "forged-at-the-holders-epoch")
    assert [e.key for e in await ledger.read(stream)] == ["step-1"]


async def test_a_fenced_append_must_prove_it_holds_the_lease(
    ledger_url: str, ledger: Ledger, stream: str
) -> None:
    """A lease's epoch is readable by every worker: naming it (through the client, or calling the function
    itself with any secret) writes nothing; only the holder's secret does."""
    resource = f"{stream}/trainer"
    lease = await ledger.claim(resource, "trainer-1", ttl_s=30)
    assert lease is not None
    await ledger.append(stream, [event("step-1")], fence=lease.fence)
    with pytest.raises(StaleFenceError, match="does not hold lease"):
        await ledger.append(stream, [event("forged")], fence=Fence(resource, lease.epoch))
    with pytest.raises(StaleFenceError, match="does not hold lease"):
        await ledger.append(stream, [event("forged")], fence=Fence(resource, lease.epoch, "x" * 40))
    with (
        psycopg.connect(ledger_url, autocommit=True) as conn,
        pytest.raises(psycopg.Error, match="does not hold"),
    ):
        conn.execute(
            "SELECT * FROM ledger_append(%s, %s, %s, NULL, ARRAY['forged'], ARRAY['Test'], ARRAY['{}'::jsonb])",
            (stream, resource, lease.epoch),
        )
    await ledger.append(
        stream, [event("step-1")], fence=Fence(resource, 1, "wrong")
    )  # a retry: its key is there
    await ledger.append(stream, [event("step-2")], fence=lease.fence)
    assert [e.key for e in await ledger.read(stream)] == ["step-1", "step-2"]


async def test_a_lease_is_granted_for_a_day_at_most(ledger: Ledger, stream: str) -> None:
    year = 365 * 24 * 3600.0
    lease = await ledger.claim(f"{stream}/lease", "a", ttl_s=year)
    assert lease is not None
    renewed = await ledger.renew(lease, ttl_s=year)
    assert renewed is not None
    for granted in (lease, renewed):
        assert (granted.expires_at - datetime.now(UTC)).total_seconds() <= 24 * 3600 + 60


async def test_an_expired_lease_can_be_taken_and_epochs_never_repeat(ledger: Ledger, stream: str) -> None:
    resource = f"{stream}/lease"
    first = await ledger.claim(resource, "a", ttl_s=0)
    second = await ledger.claim(resource, "b", ttl_s=30)
    assert second
    # A re-grant to the holder, presenting its secret, is a new epoch too.
    again = await ledger.claim(resource, "b", ttl_s=30, secret=second.secret)
    assert first and second and again
    assert (first.epoch, second.epoch, again.epoch) == (1, 2, 3)


async def test_projections_follow_events_in_the_same_transaction(ledger: Ledger, stream: str) -> None:
    run = stream.replace("/", "-")
    await ledger.append_one(
        run_stream(run),
        NewEvent(
            "created",
            Kind.RUN_CREATED,
            {"run": run, "environment": "arithmetic:env", "settings": {"max_lag": 2, "paused": False}},
        ),
    )
    await ledger.append_one(
        run_stream(run), NewEvent("lag-3", Kind.SETTINGS_CHANGED, {"run": run, "changes": {"max_lag": 3}})
    )
    # A retried settings change is not applied twice (and a failed append leaves the projection alone).
    await ledger.append_one(
        run_stream(run), NewEvent("lag-3", Kind.SETTINGS_CHANGED, {"run": run, "changes": {"max_lag": 3}})
    )
    row = await find_run(ledger, run)
    assert row is not None and (row.settings, row.updated_seq) == (RunSettings(max_lag=3), 2)


async def test_events_cannot_be_changed_or_removed(ledger_url: str, ledger: Ledger, stream: str) -> None:
    await ledger.append(stream, [event("a", n=1)])
    async with await psycopg.AsyncConnection.connect(ledger_url, autocommit=True) as conn:
        for statement in (
            "UPDATE event SET payload = '{}' WHERE stream_id = %s",
            "DELETE FROM event WHERE stream_id = %s",
        ):
            with pytest.raises(psycopg.Error, match="append-only") as raised:
                await conn.execute(statement, (stream,))
            assert raised.value.sqlstate == "RL403"
        with pytest.raises(psycopg.Error, match="append-only"):
            await conn.execute("TRUNCATE event CASCADE")
    assert [e.payload for e in await ledger.read(stream)] == [{"n": 1}]


async def test_append_many_commits_several_streams_at_once_or_not_at_all(ledger: Ledger, stream: str) -> None:
    a, b = f"{stream}/a", f"{stream}/b"
    recorded = await ledger.append_many({b: [event("b1"), event("b2")], a: [event("a1")]})
    assert [(e.key, e.seq) for e in recorded[a]] == [("a1", 1)]
    assert [(e.key, e.seq) for e in recorded[b]] == [("b1", 1), ("b2", 2)]
    # One conflicting key anywhere rolls the whole call back.
    with pytest.raises(KeyConflictError):
        await ledger.append_many({a: [event("a2")], b: [event("b1", changed=True)]})
    assert [e.key for e in await ledger.read(a)] == ["a1"]
    again = await ledger.append_many({a: [event("a1"), event("a2")]})
    assert [(e.seq, e.appended) for e in again[a]] == [(1, False), (2, True)]
