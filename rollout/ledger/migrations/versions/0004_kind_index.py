"""An index on event kind: the dashboard (and tools) read every event of one kind across streams (every
checkpoint, every eval result, every episode of a search) without scanning the turns.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("event_kind_recorded", "event", ["kind", "recorded_at"])


def downgrade() -> None:
    op.drop_index("event_kind_recorded", table_name="event")
