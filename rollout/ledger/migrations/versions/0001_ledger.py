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
-- The caller passes distinct keys (rollout.ledger.store folds repeats within a batch).
#variable_conflict use_column
DECLARE
    v_head bigint;
    v_fence bigint;
    v_fence_resource text;
    v_lease_epoch bigint;
    v_existing bigint;
    v_conflict text;
    v_new bigint;
BEGIN
    INSERT INTO stream (stream_id) VALUES (p_stream) ON CONFLICT DO NOTHING;
    -- The row lock serialises every writer of the stream: what any earlier writer committed is visible now.
    SELECT s.head_seq, s.fence_epoch, s.fence_resource INTO v_head, v_fence, v_fence_resource
      FROM stream s WHERE s.stream_id = p_stream FOR UPDATE;

    -- Key before fence: a retry of an append that already committed succeeds whatever its epoch.
    SELECT count(*),
           min(e.idempotency_key) FILTER (WHERE e.payload_sha256 <> sha256(convert_to(i.p::text, 'UTF8')))
      INTO v_existing, v_conflict
      FROM unnest(p_keys, p_payloads) AS i(k, p)
      JOIN event e ON e.stream_id = p_stream AND e.idempotency_key = i.k;
    IF v_conflict IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'RL409',
            MESSAGE = format('idempotency key %L on stream %L was already used with a different payload',
                             v_conflict, p_stream);
    END IF;
    v_new := cardinality(p_keys) - v_existing;

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

        IF v_existing = 0 THEN
            -- The common case: every key is new; seq follows the batch order.
            INSERT INTO event (stream_id, seq, idempotency_key, epoch, kind, payload, payload_sha256)
            SELECT p_stream, v_head + i.ord, i.k, p_epoch, i.kind, i.p, sha256(convert_to(i.p::text, 'UTF8'))
              FROM unnest(p_keys, p_kinds, p_payloads) WITH ORDINALITY AS i(k, kind, p, ord);
        ELSE
            INSERT INTO event (stream_id, seq, idempotency_key, epoch, kind, payload, payload_sha256)
            SELECT p_stream, v_head + row_number() OVER (ORDER BY n.ord), n.k, p_epoch, n.kind, n.p,
                   sha256(convert_to(n.p::text, 'UTF8'))
              FROM unnest(p_keys, p_kinds, p_payloads) WITH ORDINALITY AS n(k, kind, p, ord)
             WHERE NOT EXISTS (SELECT 1 FROM event e WHERE e.stream_id = p_stream AND e.idempotency_key = n.k);
        END IF;

        UPDATE stream SET head_seq = v_head + v_new,
                          fence_epoch = greatest(v_fence, p_epoch),
                          fence_resource = coalesce(v_fence_resource, p_fence_resource)
         WHERE stream_id = p_stream;
        PERFORM pg_notify('ledger', p_stream || ':' || (v_head + v_new));
    END IF;

    IF v_existing = 0 THEN
        RETURN QUERY SELECT v_head + i.ord, i.k, true, now() FROM unnest(p_keys) WITH ORDINALITY AS i(k, ord);
    ELSE
        RETURN QUERY
            SELECT e.seq, e.idempotency_key, e.seq > v_head, e.recorded_at
              FROM unnest(p_keys) WITH ORDINALITY AS i(k, ord)
              JOIN event e ON e.stream_id = p_stream AND e.idempotency_key = i.k
             ORDER BY i.ord;
    END IF;
END
$$;
"""

# Projections: derived from each new event by a trigger, inside the appending transaction, whoever appends.
PROJECTIONS = r"""
CREATE FUNCTION ledger_project_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'RunCreated' THEN
        INSERT INTO run (run_id, environment, settings, created_at, updated_seq)
        VALUES (NEW.payload->>'run', NEW.payload->>'environment', coalesce(NEW.payload->'settings', '{}'),
                NEW.recorded_at, NEW.seq);
    ELSIF NEW.kind = 'SettingsChanged' THEN
        UPDATE run SET settings = settings || (NEW.payload->'changes'), updated_seq = NEW.seq
         WHERE run_id = NEW.payload->>'run';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER event_project_run AFTER INSERT ON event
    FOR EACH ROW WHEN (NEW.kind IN ('RunCreated', 'SettingsChanged')) EXECUTE FUNCTION ledger_project_run();
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
    op.execute(PROJECTIONS)


def downgrade() -> None:
    op.execute("DROP TRIGGER event_project_run ON event")
    op.execute("DROP FUNCTION ledger_project_run()")
    op.execute("DROP TRIGGER event_no_truncate ON event")
    op.execute("DROP TRIGGER event_append_only ON event")
    op.execute("DROP FUNCTION ledger_forbid_change()")
    op.execute("DROP FUNCTION ledger_append(text, text, bigint, text[], text[], jsonb[])")
    for table in ("run", "event", "stream", "lease"):
        op.drop_table(table)
