"""Every event's payload is a JSON object.

Readers take a payload's fields by name. A payload that is a JSON array, string, number or null (which any
login allowed to append could write until now) made a reader fail on a type error instead of skipping what it
cannot parse. The constraint is added `NOT VALID`: new events are checked, a ledger's history is not scanned
(no writer of ours ever recorded anything but an object).

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE event ADD CONSTRAINT event_payload_is_an_object"
        " CHECK (jsonb_typeof(payload) = 'object') NOT VALID"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE event DROP CONSTRAINT event_payload_is_an_object")
