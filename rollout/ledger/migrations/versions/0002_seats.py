"""Seats: the projection of SeatOpened / SeatClosed events that the gateway resolves tokens against.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

PROJECTION = r"""
CREATE FUNCTION ledger_project_seat() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'SeatOpened' THEN
        INSERT INTO seat (seat_id, token_sha256, run_id, episode_id, agent, policy, checkpoint, status, opened_at)
        VALUES (NEW.payload->>'seat', decode(NEW.payload->>'token_sha256', 'hex'), NEW.payload->>'run',
                NEW.payload->>'episode', NEW.payload->>'agent', NEW.payload->>'policy',
                NEW.payload->>'checkpoint', 'open', NEW.recorded_at);
    ELSIF NEW.kind = 'SeatClosed' THEN
        UPDATE seat SET status = 'closed', closed_at = NEW.recorded_at WHERE seat_id = NEW.payload->>'seat';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER event_project_seat AFTER INSERT ON event
    FOR EACH ROW WHEN (NEW.kind IN ('SeatOpened', 'SeatClosed')) EXECUTE FUNCTION ledger_project_seat();
"""


def upgrade() -> None:
    op.create_table(
        "seat",
        sa.Column("seat_id", sa.Text(), primary_key=True),
        sa.Column("token_sha256", sa.LargeBinary(), nullable=False, unique=True),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("episode_id", sa.Text(), nullable=True),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("policy", sa.Text(), nullable=False),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.execute(PROJECTION)


def downgrade() -> None:
    op.execute("DROP TRIGGER event_project_seat ON event")
    op.execute("DROP FUNCTION ledger_project_seat()")
    op.drop_table("seat")
