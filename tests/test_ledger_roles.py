"""Each narrow role, and each lease statement, as the party that must be refused: a writer repeating another's
holder name gets no live lease and can neither renew nor release it; the dashboard's reader role calls no
function; a sandbox host's role appends only to sandbox pool streams and holds only sandbox host leases."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psycopg
import psycopg.sql
import pytest

from rollout.config import LEDGER_READER_ROLE, LEDGER_SANDBOX_ROLE, Settings
from rollout.ledger import Lease, Ledger, NewEvent
from rollout.ledger.queries import find_lease, read_all
from rollout.ledger.streams import sandbox_host_lease, sandbox_lease, sandbox_pool_stream, trainer_lease


@pytest.fixture
async def worker(stack_settings: Settings) -> AsyncIterator[Ledger]:
    async with await Ledger.connect(stack_settings.worker_ledger_url) as opened:
        yield opened


async def test_a_live_lease_goes_only_to_its_holder_with_its_secret(worker: Ledger, stream: str) -> None:
    resource = f"{stream}/lease"
    held = await worker.claim(resource, "run-1/episode-1", ttl_s=60)
    assert held is not None and held.epoch == 1 and len(held.secret) >= 32
    # Another writer that read the holder's name and epoch from the lease table: no grant, no renewal, and a
    # release that releases nothing.
    impostor = Lease(held.resource, held.holder, held.epoch, held.expires_at, secret="x" * 64)
    assert await worker.claim(resource, held.holder, ttl_s=60) is None
    assert await worker.claim(resource, held.holder, ttl_s=60, secret="x" * 64) is None
    assert await worker.renew(impostor, ttl_s=60) is None
    await worker.release(impostor)
    found = await find_lease(worker, resource)
    assert found is not None and found.epoch == 1 and found.expires_at > datetime.now(UTC)
    # The holder itself, presenting its secret, takes it again (a retried claim) and renews it.
    again = await worker.claim(resource, held.holder, ttl_s=60, secret=held.secret)
    assert again is not None and again.epoch == 2
    assert await worker.renew(again, ttl_s=60) is not None
    await worker.release(again)
    # Released, it is anyone's.
    other = await worker.claim(resource, "someone-else", ttl_s=60)
    assert other is not None and other.epoch == 3


async def test_a_lease_statement_without_a_secret_is_refused(stack_settings: Settings, stream: str) -> None:
    """Called directly, as a hostile writer would: NULL or a short secret never matches a stored hash."""
    async with await psycopg.AsyncConnection.connect(
        stack_settings.worker_ledger_url, autocommit=True
    ) as conn:
        for secret in (None, "short"):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="secret"):
                await conn.execute(
                    "SELECT * FROM ledger_claim(%s, 'h', interval '1 minute', %s)", (f"{stream}/x", secret)
                )
        with pytest.raises(psycopg.errors.UndefinedFunction):  # the old, secret-less statement is gone
            await conn.execute("SELECT * FROM ledger_claim(%s, 'h', interval '1 minute')", (f"{stream}/x",))


def test_each_narrow_role_logs_in_only_with_its_password(stack_settings: Settings) -> None:
    postgres = stack_settings.services.postgres
    for role, url in (
        (LEDGER_READER_ROLE, stack_settings.reader_ledger_url),
        (LEDGER_SANDBOX_ROLE, stack_settings.sandbox_ledger_url),
    ):
        assert url.startswith(f"postgresql://{role}:")  # the embedded server's, with its password
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("SELECT session_user").fetchone() == (role,)
        for login in (role, f"{role}:not-the-password"):
            anyone = f"postgresql://{login}@{postgres.host}:{postgres.port}/{postgres.database}"
            with pytest.raises(psycopg.OperationalError, match="password"):
                psycopg.connect(anyone, connect_timeout=5, passfile="/nonexistent").close()


async def test_the_reader_role_reads_and_calls_no_function(
    stack_settings: Settings, ledger: Ledger, stream: str
) -> None:
    await ledger.append(stream, [NewEvent("a", "Test", {"n": 1})])
    async with await Ledger.connect(stack_settings.reader_ledger_url) as reader:
        assert [e.key for e in await read_all(reader, stream)] == ["a"]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await reader.append(stream, [NewEvent("b", "Test", {"n": 2})])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await reader.claim(f"{stream}/lease", "dashboard", ttl_s=30)
    async with await psycopg.AsyncConnection.connect(
        stack_settings.reader_ledger_url, autocommit=True
    ) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute("UPDATE run SET settings = '{}'")
    assert [e.key for e in await read_all(ledger, stream)] == ["a"]


async def test_the_sandbox_role_writes_only_its_pool_and_host_leases(
    stack_settings: Settings, ledger: Ledger, stream: str
) -> None:
    kind = f"kind-{secrets.token_hex(4)}"
    async with await Ledger.connect(stack_settings.sandbox_ledger_url) as host:
        (registered,) = await host.append(
            sandbox_pool_stream(kind), [NewEvent("s@a/1", "SandboxRegistered", {})]
        )
        assert registered.appended
        hosting = await host.claim(sandbox_host_lease(kind, "s"), "http://127.0.0.1:1", ttl_s=30)
        assert hosting is not None and await host.renew(hosting, ttl_s=30) is not None
        await host.release(hosting)
        # What a compromised sandbox host would try: a turn, a reward, an episode's claim, a trainer's lease.
        for target in (f"seat/{stream}", f"run/{stream}", stream):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="sandbox pool"):
                await host.append(target, [NewEvent("forged", "TurnRecorded", {"reward": 1.0})])
        for resource in (sandbox_lease(kind, "s"), trainer_lease(stream)):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="sandbox host leases"):
                await host.claim(resource, "run/episode", ttl_s=30)
        # On its own pool's stream: a seat opened through the projections, or a fence that would shut the
        # other hosts out of the pool for good.
        seat = {"seat": f"{stream}/evil", "token_sha256": "00" * 32, "agent": "a"}
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="sandbox pool"):
            await host.append(sandbox_pool_stream(kind), [NewEvent("seat", "SeatOpened", seat)])
        fencing = await host.claim(sandbox_host_lease(kind, "t"), "http://127.0.0.1:2", ttl_s=30)
        assert fencing is not None
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="sandbox pool"):
            await host.append(
                sandbox_pool_stream(kind), [NewEvent("t", "SandboxRegistered", {})], fence=fencing.fence
            )
    for target in (f"seat/{stream}", f"run/{stream}", stream):
        assert await read_all(ledger, target) == []
    assert [e.key for e in await read_all(ledger, sandbox_pool_stream(kind))] == ["s@a/1"]


async def test_a_sandbox_host_reads_its_pools_and_not_the_runs_transcripts(
    stack_settings: Settings, ledger: Ledger, stream: str
) -> None:
    """A sandbox host runs the policy's commands: taken over, it must not read every turn and reward."""
    kind = f"shell#{stream.replace('/', '-')}"
    await ledger.append(stream, [NewEvent("turn", "TurnRecorded", {"tokens": [1, 2, 3]})])
    async with await Ledger.connect(stack_settings.sandbox_ledger_url) as host:
        await host.append(sandbox_pool_stream(kind), [NewEvent("s@a/1", "SandboxRegistered", {})])
        assert [e.key for e in await host.read(sandbox_pool_stream(kind))] == ["s@a/1"]
        assert await host.read(stream) == [], "another stream's events are not there for it"
    async with await psycopg.AsyncConnection.connect(stack_settings.sandbox_ledger_url) as conn:
        for table in ("run", "seat", "stream"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(f"SELECT count(*) FROM {table}")
            await conn.rollback()
    assert [e.key for e in await ledger.read(stream)] == ["turn"], "the services still read it"


async def test_a_login_granted_the_sandbox_role_is_held_to_it(stack_settings: Settings, stream: str) -> None:
    """A host given a login of its own, as a deployment may, is a sandbox host all the same."""
    login = f"host_{secrets.token_hex(4)}"
    password = secrets.token_hex(16)
    with psycopg.connect(stack_settings.ledger_url, autocommit=True) as owner:
        owner.execute(
            psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                psycopg.sql.Identifier(login),
                psycopg.sql.Literal(password),
                psycopg.sql.Identifier(LEDGER_SANDBOX_ROLE),
            )
        )
    postgres = stack_settings.services.postgres
    url = f"postgresql://{login}:{password}@{postgres.host}:{postgres.port}/{postgres.database}"
    try:
        async with await Ledger.connect(url) as host:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="sandbox pool"):
                await host.append(f"run/{stream}", [NewEvent("forged", "SettingsChanged", {"paused": True})])
    finally:
        with psycopg.connect(stack_settings.ledger_url, autocommit=True) as owner:
            owner.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(login)))


@pytest.mark.parametrize("role", [LEDGER_READER_ROLE, LEDGER_SANDBOX_ROLE])
async def test_each_narrow_role_holds_select_and_no_change_on_every_table(
    stack_settings: Settings, role: str
) -> None:
    url = (
        stack_settings.reader_ledger_url if role == LEDGER_READER_ROLE else stack_settings.sandbox_ledger_url
    )
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        # A sandbox host reads its pools' events and the leases (rows of other streams: below), nothing else.
        readable = (
            ("event", "lease") if role == LEDGER_SANDBOX_ROLE else ("event", "stream", "lease", "run", "seat")
        )
        for table in ("event", "stream", "lease", "run", "seat"):
            for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"):
                row = await (
                    await conn.execute("SELECT has_table_privilege(current_user, %s, %s)", (table, privilege))
                ).fetchone()
                assert row == (privilege == "SELECT" and table in readable,), (role, table, privilege)
        rows = await (
            await conn.execute(
                "SELECT p.proname FROM pg_proc p WHERE p.proname LIKE 'ledger\\_%' "
                "AND p.prorettype <> 'trigger'::regtype AND has_function_privilege(current_user, p.oid, 'EXECUTE') "
                "ORDER BY p.proname"
            )
        ).fetchall()
    callable_by_role = [r[0] for r in rows]
    if role == LEDGER_READER_ROLE:
        assert callable_by_role == []
    else:
        assert callable_by_role == ["ledger_append", "ledger_claim", "ledger_release", "ledger_renew"]
