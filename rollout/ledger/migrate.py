"""Create the ledger database if needed and bring its schema to the newest migration.

Safe to run from several processes at once: migrations take an advisory lock, and creating the database
tolerates a concurrent creator. Never drops or rewrites data. `set_password` gives a role the password it
logs in with.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from rollout.ledger.errors import LedgerUnreachableError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK = 7_240_501  # pg_advisory_lock key: one migrator at a time per database


def _with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def ensure_database(url: str) -> None:
    """Create the URL's database when the server lacks it (connecting to the server's `postgres` db)."""
    database = urlsplit(url).path.lstrip("/") or "postgres"
    try:
        with psycopg.connect(_with_database(url, "postgres"), autocommit=True, connect_timeout=5) as admin:
            exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
            if exists is None:
                # Another starter may create it between our check and our create: that is fine.
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    except psycopg.OperationalError as error:
        raise LedgerUnreachableError(url, str(error)) from error


def alembic_config(url: str) -> Config:
    from alembic.config import Config  # alembic and SQLAlchemy cost a second to import: only when migrating

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url))
    return config


def sqlalchemy_url(url: str) -> str:
    """SQLAlchemy's spelling of a postgresql:// URL, with the psycopg 3 driver."""
    scheme, rest = url.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme in ("postgresql", "postgres") else url


def head_revision() -> str:
    """The newest migration this code ships (what `upgrade` brings a database to)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def newest_shipped() -> str:
    """The newest migration file's revision, read without alembic: the files are named and numbered
    `NNNN_what.py` with revision "NNNN", each revising the one before (tests/test_migrations.py checks this
    agrees with alembic's `head_revision`)."""
    return max(
        path.name.split("_", 1)[0] for path in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")
    )


def applied_revision(url: str) -> str | None:
    """The revision the database is at (None before the first migration)."""
    try:
        with psycopg.connect(url, connect_timeout=5) as connection:
            row = connection.execute("SELECT version_num FROM alembic_version LIMIT 1").fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    except psycopg.OperationalError as error:
        raise LedgerUnreachableError(url, str(error)) from error
    return str(row[0]) if row else None


def server_and_revision(url: str) -> tuple[str, str | None]:
    """The server's version and the revision its schema is at (None before the first migration); a server
    that does not answer is `LedgerUnreachableError`. Changes nothing."""
    try:
        with psycopg.connect(url, connect_timeout=3) as connection:
            version = connection.execute("SHOW server_version").fetchone()
            revision = connection.execute(
                "SELECT version_num FROM alembic_version"
                " WHERE EXISTS (SELECT 1 FROM pg_tables WHERE tablename = 'alembic_version')"
            ).fetchone()
    except psycopg.Error as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LedgerUnreachableError(url, reason) from error
    return (str(version[0]) if version else "?"), (str(revision[0]) if revision else None)


def upgrade(url: str) -> None:
    """Create the database if needed and apply every migration not yet applied.

    Raises `LedgerUnreachableError` when the server cannot be reached or goes away mid-way; each migration
    runs in one transaction, so calling `upgrade` again once the server is back finishes the job.
    """
    from sqlalchemy.exc import OperationalError

    ensure_database(url)
    if applied_revision(url) == newest_shipped():
        return  # current: skip alembic, which costs seconds to import and run (every `rollout train` migrates)
    from alembic import command

    try:
        command.upgrade(alembic_config(url), "head")
    except OperationalError as error:
        raise LedgerUnreachableError(url, str(error.orig or error)) from error


def set_password(url: str, role: str, password: str) -> None:
    """Give `role` (made by the migrations, or the server's own `postgres`) `password` to log in with,
    connected as the owner at `url` (the embedded server's roles: rollout.stack.postgres)."""
    statement = sql.SQL("ALTER ROLE {} WITH LOGIN PASSWORD {}").format(
        sql.Identifier(role), sql.Literal(password)
    )
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as owner:
            owner.execute(statement)
    except psycopg.OperationalError as error:
        raise LedgerUnreachableError(url, str(error)) from error
