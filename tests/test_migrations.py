"""The migrated database is exactly what the SQLModel schema declares, and migrating twice is harmless."""

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
        assert context.get_current_revision() == migrate.head_revision() == "0004"
        assert compare_metadata(context, SQLModel.metadata) == []
    engine.dispose()
