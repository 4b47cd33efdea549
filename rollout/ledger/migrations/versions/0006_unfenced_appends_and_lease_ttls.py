"""An append that holds no lease can no longer fence a stream, and a lease is granted for at most a day.

Before, `ledger_append` took the epoch an unfenced append named and raised the stream's fence to it: any writer
of the ledger could append one event with epoch 2^62 to a stream and fence its real, leased writer out for
good. Now an append without a fence resource carries epoch 0 (what `rollout.ledger.store` sends) and is
refused on a stream that a lease fences (`RL410`, a stale fence): only the lease's holder writes there.

`ledger_claim` and `ledger_renew` grant at most `MAX_TTL`, whatever is asked: a lease asked for a year would
keep its resource from every successor long after its holder died. Holders renew well inside their TTL, so
none asks for more.

`CREATE OR REPLACE` keeps each function's owner and grants but resets its other properties, so the definer's
rights and pinned search path of 0003 are set again.

Revision ID: 0006
Revises: 0005
"""

import importlib

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

MAX_TTL = "1 day"
FUNCTIONS = (
    "ledger_append(text, text, bigint, text[], text[], jsonb[])",
    "ledger_claim(text, text, interval)",
    "ledger_renew(text, text, bigint, interval)",
)
FENCE_CHECK = "        IF p_epoch < v_fence THEN\n"
UNFENCED_CHECK = """        IF p_fence_resource IS NULL AND p_epoch <> 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'RL410',
                MESSAGE = format('an append to stream %L holding no lease must carry epoch 0, not %s',
                                 p_stream, p_epoch);
        END IF;
        IF p_fence_resource IS NULL AND v_fence_resource IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'RL410',
                MESSAGE = format('stream %L is fenced by lease %L: only its holder appends there',
                                 p_stream, v_fence_resource);
        END IF;
"""


def _lease_functions(ttl: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION ledger_claim(p_resource text, p_holder text, p_ttl interval)
RETURNS TABLE (resource text, holder text, epoch bigint, expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER AS $$
INSERT INTO lease AS l (resource, holder, epoch, expires_at)
VALUES (p_resource, p_holder, 1, now() + {ttl})
ON CONFLICT (resource) DO UPDATE
   SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
 WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder
RETURNING l.resource, l.holder, l.epoch, l.expires_at
$$;

CREATE OR REPLACE FUNCTION ledger_renew(p_resource text, p_holder text, p_epoch bigint, p_ttl interval)
RETURNS TABLE (resource text, holder text, epoch bigint, expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER AS $$
UPDATE lease AS l SET expires_at = now() + {ttl}
 WHERE l.resource = p_resource AND l.holder = p_holder AND l.epoch = p_epoch
RETURNING l.resource, l.holder, l.epoch, l.expires_at
$$;
"""


def _append_function(checked: bool) -> str:
    # 0001's text as 0005 left it, edited: one place states the function (module names start with a digit).
    first = importlib.import_module("rollout.ledger.migrations.versions.0001_ledger")
    fifth = importlib.import_module("rollout.ledger.migrations.versions.0005_append_existing_stream")
    sql = fifth._function(first.APPEND_FUNCTION, create_first=False)
    if checked:
        assert FENCE_CHECK in sql, "0001's ledger_append changed shape"
        sql = sql.replace(FENCE_CHECK, UNFENCED_CHECK + FENCE_CHECK, 1)
    return sql.replace("CREATE FUNCTION ledger_append(", "CREATE OR REPLACE FUNCTION ledger_append(", 1)


def _secure() -> None:
    for function in FUNCTIONS:
        op.execute(
            f"DO $$ BEGIN EXECUTE format('ALTER FUNCTION {function} SECURITY DEFINER SET search_path = %I, "
            "pg_temp', current_schema()); END $$;"
        )


def upgrade() -> None:
    op.execute(_append_function(checked=True))
    op.execute(_lease_functions(f"least(p_ttl, interval '{MAX_TTL}')"))
    _secure()


def downgrade() -> None:
    op.execute(_append_function(checked=False))
    op.execute(_lease_functions("p_ttl"))
    _secure()
