"""A ledger client rides out a lost database: Postgres SIGKILLed under a stream of appends, or shut down by an
administrator, comes back and every append lands exactly once; past the reconnect window, the caller gets
`LedgerUnreachableError` naming the URL."""

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rollout.ledger import Ledger, NewEvent, migrate
from rollout.ledger.errors import LedgerUnreachableError
from rollout.net import free_port
from rollout.stack.postgres import EmbeddedPostgres


async def start_again(postgres: EmbeddedPostgres) -> None:
    """What the supervisor does after a crash: start it, retrying while the dead server's backends exit, until
    it answers (just after the SIGKILL the dead postmaster can still look alive, and `start` then starts
    nothing)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await asyncio.to_thread(postgres.start)
            if await asyncio.to_thread(port_answers, postgres.port):
                return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(
                f"Postgres did not answer on port {postgres.port} within 60 s of its restart"
            )
        await asyncio.sleep(0.5)


def port_answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


async def test_appends_ride_out_a_crash_and_an_admin_shutdown_exactly_once(tmp_path: Path) -> None:
    postgres = EmbeddedPostgres(tmp_path, "127.0.0.1", free_port())
    await asyncio.to_thread(postgres.start)
    url = postgres.url("rollout")
    try:
        await asyncio.to_thread(migrate.upgrade, url)
        async with await Ledger.connect(url, max_size=4) as ledger:
            written: list[int] = []

            async def writer() -> None:
                for n in range(80):
                    recorded = await ledger.append_one("chaos", NewEvent(f"k{n}", "T", {"n": n}))
                    written.append(recorded.seq)
                    await asyncio.sleep(0.05)

            appending = asyncio.create_task(writer())
            await asyncio.sleep(0.5)
            pid = postgres.pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # a crash: no shutdown, connections simply die
            await asyncio.sleep(1.0)
            assert not appending.done(), "the writer waits for the server instead of failing"
            await start_again(postgres)
            await asyncio.sleep(0.5)
            # A fast shutdown by an administrator: connections get AdminShutdown mid-session.
            await asyncio.to_thread(postgres.restart)
            await asyncio.wait_for(appending, 120)

            events = await ledger.read("chaos")
            assert [e.key for e in events] == [f"k{n}" for n in range(80)], "each append once, in order"
            assert written == list(range(1, 81))
    finally:
        await asyncio.to_thread(postgres.remove)


async def test_past_the_reconnect_window_the_caller_gets_a_clear_error(tmp_path: Path) -> None:
    postgres = EmbeddedPostgres(tmp_path, "127.0.0.1", free_port())
    await asyncio.to_thread(postgres.start)
    url = postgres.url("rollout")
    try:
        await asyncio.to_thread(migrate.upgrade, url)
        async with await Ledger.connect(url, reconnect_window_s=2) as ledger:
            await asyncio.to_thread(postgres.stop)
            started = time.monotonic()
            with pytest.raises(LedgerUnreachableError) as raised:
                await ledger.find("chaos", "k0")
            assert time.monotonic() - started < 10
            assert f"{postgres.port}" in str(raised.value) and "rollout up" in str(raised.value)
    finally:
        await asyncio.to_thread(postgres.remove)


async def test_a_lock_left_behind_by_a_dead_server_whose_pid_lives_on_does_not_stop_a_start(
    tmp_path: Path,
) -> None:
    # A postmaster killed with SIGKILL leaves its lock file; its pid can still be a zombie no one has
    # reaped yet, or another program's by the time the supervisor starts Postgres again. Postgres refuses
    # such a lock.
    postgres = EmbeddedPostgres(tmp_path, "127.0.0.1", free_port())
    await asyncio.to_thread(postgres.start)
    lock = postgres.cluster_dir / "postmaster.pid"
    left = lock.read_text().splitlines()
    await asyncio.to_thread(postgres.stop)
    owner = postgres.cluster_dir.stat()
    # Postgres's own user's: a process of another user Postgres already takes for a stale lock's.
    mine = os.geteuid() == owner.st_uid
    other = await asyncio.to_thread(
        subprocess.Popen,
        ["sleep", "60"],
        user=None if mine else owner.st_uid,
        group=None if mine else owner.st_gid,
    )
    try:
        lock.write_text("\n".join([str(other.pid), *left[1:]]) + "\n")
        os.chown(lock, owner.st_uid, owner.st_gid)
        assert await asyncio.to_thread(postgres.start), "started at the first try"
        assert port_answers(postgres.port) and postgres.pid() != other.pid
    finally:
        other.kill()
        other.wait()
        await asyncio.to_thread(postgres.remove)


async def test_a_migration_cut_off_by_a_crash_says_so_and_finishes_when_run_again(tmp_path: Path) -> None:
    import psycopg

    postgres = EmbeddedPostgres(tmp_path, "127.0.0.1", free_port())
    await asyncio.to_thread(postgres.start)
    url = postgres.url("rollout")
    try:
        await asyncio.to_thread(migrate.ensure_database, url)
        # Another migrator holds the lock, so ours is inside alembic (connected, waiting) when the server
        # dies.
        with psycopg.connect(url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (migrate.MIGRATION_LOCK,))
            migrating = asyncio.create_task(asyncio.to_thread(migrate.upgrade, url))
            await asyncio.sleep(2.0)
            assert not migrating.done()
            pid = postgres.pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(LedgerUnreachableError) as raised:
                await asyncio.wait_for(migrating, 60)
        assert f"{postgres.port}" in str(raised.value)
        await start_again(postgres)
        await asyncio.to_thread(migrate.upgrade, url)
        with psycopg.connect(url) as check:
            row = check.execute("SELECT version_num FROM alembic_version").fetchone()
        assert row == (migrate.head_revision(),)
    finally:
        await asyncio.to_thread(postgres.remove)
