"""The migrated database is exactly what the SQLModel schema declares, and migrating twice is harmless."""

import uuid

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from rollout.ledger import migrate
from rollout.ledger.schema import SQLModel


def test_migrations_match_the_models_and_are_idempotent(ledger_url: str) -> None:
    migrate.upgrade(ledger_url)  # the session stack already migrated: this must be a no-op
    engine = create_engine(migrate.sqlalchemy_url(ledger_url))
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert context.get_current_revision() == migrate.head_revision() == "0011"
        assert compare_metadata(context, SQLModel.metadata) == []
    engine.dispose()


def test_a_current_ledger_skips_alembic_and_an_older_one_is_upgraded(ledger_url: str) -> None:
    from alembic import command

    assert migrate.newest_shipped() == migrate.head_revision()
    assert migrate.applied_revision(ledger_url) == migrate.head_revision()
    older = ledger_url.rsplit("/", 1)[0] + f"/older_{uuid.uuid4().hex[:8]}"
    migrate.ensure_database(older)
    assert migrate.applied_revision(older) is None  # a new database has no schema yet
    command.upgrade(migrate.alembic_config(older), "0003")
    assert migrate.applied_revision(older) == "0003"
    migrate.upgrade(older)
    assert migrate.applied_revision(older) == migrate.head_revision()
    # 0005 to 0008 replace ledger_append, 0006 and 0007 the lease functions: down and up again, each
    # keeps its definer's rights and pinned search path.
    command.downgrade(migrate.alembic_config(older), "0004")  # 0009 to 0011 go down and up too
    command.upgrade(migrate.alembic_config(older), "head")
    with psycopg.connect(older) as conn:
        functions = conn.execute(
            "SELECT proname, prosecdef, proconfig FROM pg_proc "
            "WHERE proname IN ('ledger_append', 'ledger_claim', 'ledger_renew')"
        ).fetchall()
    assert len(functions) == 3
    for name, secure, settings in functions:
        assert secure and any(s.startswith("search_path=") for s in settings or []), name
