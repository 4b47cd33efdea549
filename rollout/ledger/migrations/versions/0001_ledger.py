"""The ledger: leases, streams, append-only events, the append function, the run projection.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# SQLSTATEs raised by the ledger; rollout.ledger.errors maps them to Python exceptions.
#   RL409: an idempotency key reused with a different payload
#   RL410: a stale fence (the writer's lease epoch is no longer current)
#   RL403: an attempt to change or remove an event

APPEND_FUNCTION = r"""
CREATE FUNCTION ledger_append(
    p_stream text, p_fence_resource text, p_epoch bigint,
    p_keys text[], p_kinds text[], p_payloads jsonb[])
RETURNS TABLE (seq bigint, idempotency_key text, appended boolean, recorded_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_head bigint;
    v_fence bigint;
    v_fence_resource text;
    v_lease_epoch bigint;
    v_conflict text;
    v_new bigint;
BEGIN
    INSERT INTO stream (stream_id) VALUES (p_stream) ON CONFLICT DO NOTHING;
    -- The row lock serialises every writer of the stream: what any earlier writer committed is visible now.
    SELECT s.head_seq, s.fence_epoch, s.fence_resource INTO v_head, v_fence, v_fence_resource
      FROM stream s WHERE s.stream_id = p_stream FOR UPDATE;

    SELECT i.k INTO v_conflict FROM unnest(p_keys, p_payloads) AS i(k, p)
     GROUP BY i.k HAVING count(DISTINCT i.p) > 1 LIMIT 1;
    IF v_conflict IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'RL409',
            MESSAGE = format('idempotency key %L appears twice in one append to stream %L with different payloads',
                             v_conflict, p_stream);
    END IF;

    -- Key before fence: a retry of an append that already committed succeeds whatever its epoch.
    SELECT e.idempotency_key INTO v_conflict
      FROM event e JOIN unnest(p_keys, p_payloads) AS i(k, p) ON e.idempotency_key = i.k
     WHERE e.stream_id = p_stream AND e.payload_sha256 <> sha256(convert_to(i.p::text, 'UTF8'))
     LIMIT 1;
    IF v_conflict IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'RL409',
            MESSAGE = format('idempotency key %L on stream %L was already used with a different payload',
                             v_conflict, p_stream);
    END IF;

    SELECT count(DISTINCT i.k) INTO v_new FROM unnest(p_keys) AS i(k)
     WHERE NOT EXISTS (SELECT 1 FROM event e WHERE e.stream_id = p_stream AND e.idempotency_key = i.k);

    IF v_new > 0 THEN
        IF p_epoch < v_fence THEN
            RAISE EXCEPTION USING ERRCODE = 'RL410',
                MESSAGE = format('stale fence on stream %L: epoch %s is below the stream''s epoch %s',
                                 p_stream, p_epoch, v_fence);
        END IF;
        IF p_fence_resource IS NOT NULL THEN
            IF v_fence_resource IS NOT NULL AND v_fence_resource <> p_fence_resource THEN
                RAISE EXCEPTION USING ERRCODE = 'RL410',
                    MESSAGE = format('stream %L is fenced by lease %L, not %L',
                                     p_stream, v_fence_resource, p_fence_resource);
            END IF;
            -- FOR SHARE holds off a takeover until this append commits, so a successor that claims the
            -- lease afterwards reads everything written under the old epoch.
            SELECT l.epoch INTO v_lease_epoch FROM lease l WHERE l.resource = p_fence_resource FOR SHARE;
            IF v_lease_epoch IS DISTINCT FROM p_epoch THEN
                RAISE EXCEPTION USING ERRCODE = 'RL410',
                    MESSAGE = format('stale fence on stream %L: lease %L is at epoch %s, the writer holds %s',
                                     p_stream, p_fence_resource, coalesce(v_lease_epoch::text, 'none'), p_epoch);
            END IF;
        END IF;

        INSERT INTO event (stream_id, seq, idempotency_key, epoch, kind, payload, payload_sha256)
        SELECT p_stream, v_head + row_number() OVER (ORDER BY n.ord), n.k, p_epoch, n.kind, n.p,
               sha256(convert_to(n.p::text, 'UTF8'))
          FROM (SELECT DISTINCT ON (i.k) i.k, i.kind, i.p, i.ord
                  FROM unnest(p_keys, p_kinds, p_payloads) WITH ORDINALITY AS i(k, kind, p, ord)
                 WHERE NOT EXISTS (SELECT 1 FROM event e WHERE e.stream_id = p_stream AND e.idempotency_key = i.k)
                 ORDER BY i.k, i.ord) AS n;

        UPDATE stream SET head_seq = v_head + v_new,
                          fence_epoch = greatest(v_fence, p_epoch),
                          fence_resource = coalesce(v_fence_resource, p_fence_resource)
         WHERE stream_id = p_stream;
        PERFORM pg_notify('ledger', p_stream || ':' || (v_head + v_new));
    END IF;

    RETURN QUERY
        SELECT e.seq, e.idempotency_key, e.seq > v_head, e.recorded_at
          FROM unnest(p_keys) WITH ORDINALITY AS i(k, ord)
          JOIN event e ON e.stream_id = p_stream AND e.idempotency_key = i.k
         ORDER BY i.ord;
END
$$;
"""

APPEND_ONLY = r"""
CREATE FUNCTION ledger_forbid_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'RL403',
        MESSAGE = format('the ledger is append-only: %s on %I is not allowed', TG_OP, TG_TABLE_NAME);
END
$$;
CREATE TRIGGER event_append_only BEFORE UPDATE OR DELETE ON event
    FOR EACH ROW EXECUTE FUNCTION ledger_forbid_change();
CREATE TRIGGER event_no_truncate BEFORE TRUNCATE ON event
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_forbid_change();
"""


def upgrade() -> None:
    op.create_table(
        "lease",
        sa.Column("resource", sa.Text(), primary_key=True),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "stream",
        sa.Column("stream_id", sa.Text(), primary_key=True),
        sa.Column("head_seq", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("fence_epoch", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("fence_resource", sa.Text(), nullable=True),
    )
    op.create_table(
        "event",
        sa.Column("stream_id", sa.Text(), sa.ForeignKey("stream.stream_id"), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("payload_sha256", sa.LargeBinary(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.UniqueConstraint("stream_id", "idempotency_key", name="event_stream_key_unique"),
    )
    op.create_table(
        "run",
        sa.Column("run_id", sa.Text(), primary_key=True),
        sa.Column("environment", sa.Text(), nullable=False),
        sa.Column("settings", postgresql.JSONB(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_seq", sa.BigInteger(), nullable=False),
    )
    op.execute(APPEND_FUNCTION)
    op.execute(APPEND_ONLY)


def downgrade() -> None:
    op.execute("DROP TRIGGER event_no_truncate ON event")
    op.execute("DROP TRIGGER event_append_only ON event")
    op.execute("DROP FUNCTION ledger_forbid_change()")
    op.execute("DROP FUNCTION ledger_append(text, text, bigint, text[], text[], jsonb[])")
    for table in ("run", "event", "stream", "lease"):
        op.drop_table(table)
