"""`ledger_append` looks its stream up before creating it: an append to a stream that exists (all but the first)
no longer pays an `INSERT ... ON CONFLICT DO NOTHING` on `stream`. Nothing else changes: the same checks in the
same order, the same rows returned.

`CREATE OR REPLACE` keeps the function's owner and grants but resets its other properties, so the definer's
rights and pinned search path of 0003 are set again.

Revision ID: 0005
Revises: 0004
"""

import importlib

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

APPEND = "ledger_append(text, text, bigint, text[], text[], jsonb[])"
CREATE_STREAM = "    INSERT INTO stream (stream_id) VALUES (p_stream) ON CONFLICT DO NOTHING;\n"
LOCK_STREAM = """    SELECT s.head_seq, s.fence_epoch, s.fence_resource INTO v_head, v_fence, v_fence_resource
      FROM stream s WHERE s.stream_id = p_stream FOR UPDATE;
"""


def _function(body_of_0001: str, *, create_first: bool) -> str:
    if create_first:
        return body_of_0001
    moved = body_of_0001.replace(CREATE_STREAM, "").replace(
        LOCK_STREAM,
        LOCK_STREAM
        + "    IF NOT FOUND THEN  -- the stream's first append\n"
        + "    "
        + CREATE_STREAM
        + LOCK_STREAM.replace("    ", "        ")
        + "    END IF;\n",
    )
    assert moved != body_of_0001 and CREATE_STREAM.strip() in moved, "0001's ledger_append changed shape"
    return moved


def _replace(create_first: bool) -> None:
    # 0001's text, edited: one place states the function (the module's name starts with a digit).
    first = importlib.import_module("rollout.ledger.migrations.versions.0001_ledger")
    sql = _function(first.APPEND_FUNCTION, create_first=create_first)
    op.execute(sql.replace("CREATE FUNCTION ledger_append(", "CREATE OR REPLACE FUNCTION ledger_append(", 1))
    op.execute(
        "DO $$ BEGIN EXECUTE format('ALTER FUNCTION "
        + APPEND
        + " SECURITY DEFINER SET search_path = %I, pg_temp', current_schema()); END $$;"
    )


def upgrade() -> None:
    _replace(create_first=False)


def downgrade() -> None:
    _replace(create_first=True)
