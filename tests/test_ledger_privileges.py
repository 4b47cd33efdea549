"""The worker role services connect with: it reads the ledger and appends and leases through the ledger's
functions, and the database itself (privileges, not the append-only trigger) refuses it any UPDATE, DELETE,
TRUNCATE or direct INSERT. A migration downgrade and upgrade again leaves the same grants."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import LiteralString, cast

import psycopg
import pytest
from psycopg import sql

from rollout.config import LEDGER_WORKER_ROLE, Settings
from rollout.ledger import AppendOnlyError, Ledger, NewEvent, migrate
from rollout.ledger.errors import translate
from rollout.ledger.queries import find_lease, read_all
from rollout.net import free_port
from rollout.stack.postgres import EmbeddedPostgres

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


def test_no_role_logs_in_without_its_password(stack_settings: Settings) -> None:
    """Any process of the machine reaches the embedded server's port; only the password lets it in."""
    postgres = stack_settings.services.postgres
    for user in ("postgres", LEDGER_WORKER_ROLE):
        for login in (user, f"{user}:not-the-password"):
            url = f"postgresql://{login}@{postgres.host}:{postgres.port}/{postgres.database}"
            with pytest.raises(psycopg.OperationalError, match="password"):
                psycopg.connect(url, connect_timeout=5, passfile="/nonexistent").close()
    with psycopg.connect(stack_settings.ledger_url, connect_timeout=5) as owner:
        (method,) = owner.execute("SELECT current_setting('password_encryption')").fetchone() or ("",)
    assert method == "scram-sha-256"


@pytest.fixture
def worker_url(stack_settings: Settings) -> str:
    url = stack_settings.worker_ledger_url
    assert url.startswith(f"postgresql://{LEDGER_WORKER_ROLE}:")  # derived by config: the embedded server's
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
            "SELECT * FROM ledger_append(%s, NULL, 0, NULL, ARRAY['a'], ARRAY['Test'], ARRAY['{}'::jsonb])",
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


def test_downgrading_and_upgrading_again_restores_the_grants(scratch_database: str, worker_url: str) -> None:
    from alembic import command

    migrate.upgrade(scratch_database)
    worker = migrate._with_database(worker_url, scratch_database.rsplit("/", 1)[1])
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


def test_a_cluster_made_before_passwords_is_given_them_when_it_starts(tmp_path: Path) -> None:
    """A data directory from before (initdb --auth=trust) lets any local process in as the superuser until
    its server starts again."""
    postgres = EmbeddedPostgres(tmp_path, "127.0.0.1", free_port())
    postgres.ensure_cluster()
    rules = postgres.cluster_dir / "pg_hba.conf"
    rules.write_text(rules.read_text().replace("scram-sha-256", "trust"))
    anyone = f"postgresql://postgres@127.0.0.1:{postgres.port}/postgres"
    try:
        postgres.start()
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(anyone, connect_timeout=5, passfile="/nonexistent").close()
        with psycopg.connect(postgres.url(), connect_timeout=5) as owner:
            assert owner.execute("SELECT current_user").fetchone() == ("postgres",)
    finally:
        postgres.remove()
