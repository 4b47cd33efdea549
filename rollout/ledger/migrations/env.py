"""Alembic environment: migrate the ledger database under an advisory lock, so racing starters are safe."""

from alembic import context
from sqlalchemy import create_engine, text

from rollout.ledger.migrate import MIGRATION_LOCK
from rollout.ledger.schema import SQLModel

url = context.config.get_main_option("sqlalchemy.url")
assert url, "the ledger URL is set by rollout.ledger.migrate"
engine = create_engine(url)
with engine.connect() as connection:
    connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
    connection.commit()
    try:
        context.configure(connection=connection, target_metadata=SQLModel.metadata)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    finally:
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
        connection.commit()
engine.dispose()
