"""The worker role services connect with: it reads the ledger and appends and leases through the ledger's
functions, and the database itself (privileges, not the append-only trigger) refuses it any UPDATE, DELETE,
TRUNCATE or direct INSERT. A migration downgrade and upgrade again leaves the same grants."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import LiteralString, cast

import psycopg
import pytest
from psycopg import sql

from rollout.config import LEDGER_WORKER_ROLE, Settings
from rollout.ledger import AppendOnlyError, Ledger, NewEvent, migrate
from rollout.ledger.errors import translate
from rollout.ledger.queries import find_lease, read_all

TABLES = ("event", "stream", "lease", "run", "seat")
CHANGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")

# What a worker might try on rows others wrote; each must fail for want of privilege.
FORBIDDEN = [
    "UPDATE event SET payload = '{}' WHERE stream_id = %(stream)s",
    "DELETE FROM event WHERE stream_id = %(stream)s",
    "TRUNCATE event",
    "INSERT INTO event (stream_id, seq, idempotency_key, epoch, kind, payload, payload_sha256)"
    " VALUES (%(stream)s, 99, 'forged', 0, 'Test', '{}', '\\x00')",
    "UPDATE stream SET head_seq = 0 WHERE stream_id = %(stream)s",
    "DELETE FROM stream WHERE stream_id = %(stream)s",
    "UPDATE lease SET epoch = 1 WHERE resource = %(stream)s",
    "DELETE FROM lease WHERE resource = %(stream)s",
    "UPDATE run SET settings = '{}'",
    "DELETE FROM seat",
]


@pytest.fixture
def worker_url(stack_settings: Settings) -> str:
    url = stack_settings.worker_ledger_url
    assert f"//{LEDGER_WORKER_ROLE}@" in url  # derived by config for the embedded server
    return url


@pytest.fixture
async def worker(worker_url: str) -> AsyncIterator[Ledger]:
    async with await Ledger.connect(worker_url) as opened:
        yield opened


async def test_the_worker_role_appends_leases_and_reads(worker: Ledger, ledger: Ledger, stream: str) -> None:
    (first,) = await worker.append(stream, [NewEvent("a", "Test", {"n": 1})])
    assert first.seq == 1 and first.appended
    lease = await worker.claim(f"{stream}/lease", "worker-1", ttl_s=30)
    assert lease is not None and lease.epoch == 1
    renewed = await worker.renew(lease, ttl_s=60)
    assert renewed is not None and renewed.expires_at > lease.expires_at
    (fenced,) = await worker.append(stream, [NewEvent("b", "Test", {"n": 2})], fence=lease.fence)
    assert fenced.seq == 2
    await worker.release(lease)
    again = await worker.claim(f"{stream}/lease", "worker-2", ttl_s=30)
    assert again is not None and again.epoch == 2
    # What the worker wrote is what the owner reads, and the worker reads it too.
    assert [e.key for e in await read_all(ledger, stream)] == ["a", "b"]
    assert [e.key for e in await read_all(worker, stream)] == ["a", "b"]
    assert await worker.find(stream, "b") is not None
    found = await find_lease(worker, f"{stream}/lease")
    assert found is not None and found.holder == "worker-2"


@pytest.mark.parametrize("statement", FORBIDDEN)
async def test_the_worker_role_may_not_change_or_remove_rows(
    worker_url: str, ledger: Ledger, stream: str, statement: str
) -> None:
    await ledger.append(stream, [NewEvent("a", "Test", {"n": 1})])
    await ledger.claim(stream, "owner", ttl_s=30)
    async with await psycopg.AsyncConnection.connect(worker_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            await conn.execute(cast(LiteralString, statement), {"stream": stream})
    (kept,) = await read_all(ledger, stream)
    assert kept.payload == {"n": 1}


async def test_the_owner_is_still_stopped_by_the_append_only_trigger(ledger_url: str, stream: str) -> None:
    async with await Ledger.connect(ledger_url) as owner:
        await owner.append(stream, [NewEvent("a", "Test", {"n": 1})])
    async with await psycopg.AsyncConnection.connect(ledger_url, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as raised:
            await conn.execute("UPDATE event SET payload = '{}' WHERE stream_id = %s", (stream,))
        assert isinstance(translate(raised.value), AppendOnlyError)


async def test_grants_are_exactly_select_and_the_ledger_functions(worker_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(worker_url, autocommit=True) as conn:
        for table in TABLES:
            for privilege in ("SELECT", *CHANGES):
                row = await (
                    await conn.execute("SELECT has_table_privilege(current_user, %s, %s)", (table, privilege))
                ).fetchone()
                assert row == (privilege == "SELECT",), (table, privilege)
        functions = await (
            await conn.execute(
                "SELECT p.proname, p.prosecdef, p.proconfig, has_function_privilege(current_user, p.oid, 'EXECUTE')"
                " FROM pg_proc p WHERE p.proname LIKE 'ledger\\_%' AND p.prorettype <> 'trigger'::regtype"
                " ORDER BY p.proname"
            )
        ).fetchall()
    assert [f[0] for f in functions] == ["ledger_append", "ledger_claim", "ledger_release", "ledger_renew"]
    for name, definer, config, executable in functions:
        assert definer and executable, name
        assert config == ["search_path=public, pg_temp"], name


async def test_a_temporary_table_cannot_stand_in_for_the_ledger(
    worker_url: str, ledger: Ledger, stream: str
) -> None:
    """The functions run with their owner's rights: their search path is pinned, so a worker's temporary table
    named like a ledger table is never the one they write."""
    async with await psycopg.AsyncConnection.connect(worker_url, autocommit=True) as conn:
        await conn.execute("CREATE TEMP TABLE stream (stream_id text, head_seq bigint, fence_epoch bigint)")
        await conn.execute(
            "SELECT * FROM ledger_append(%s, NULL, 0, ARRAY['a'], ARRAY['Test'], ARRAY['{}'::jsonb])",
            (stream,),
        )
        row = await (await conn.execute("SELECT count(*) FROM pg_temp.stream")).fetchone()
        assert row == (0,)
    assert await ledger.head(stream) == 1


@pytest.fixture
def scratch_database(ledger_url: str) -> Iterator[str]:
    name = f"privileges_{uuid.uuid4().hex[:8]}"
    url = migrate._with_database(ledger_url, name)
    yield url
    with psycopg.connect(migrate._with_database(ledger_url, "postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_downgrading_and_upgrading_again_restores_the_grants(scratch_database: str) -> None:
    from alembic import command

    migrate.upgrade(scratch_database)
    worker = scratch_database.replace("//postgres@", f"//{LEDGER_WORKER_ROLE}@")
    command.downgrade(migrate.alembic_config(scratch_database), "0002")
    with psycopg.connect(worker) as conn:
        assert conn.execute("SELECT has_table_privilege(current_user, 'event', 'SELECT')").fetchone() == (
            False,
        )
    migrate.upgrade(scratch_database)
    with psycopg.connect(worker, autocommit=True) as conn:
        assert conn.execute("SELECT has_table_privilege(current_user, 'event', 'SELECT')").fetchone() == (
            True,
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM event")
