"""A fenced append proves it holds its lease: the holder's secret, not only the epoch anyone can read.

Before, `ledger_append` accepted a fenced append whose epoch was the lease's current one. Epochs are in the
`lease` table every worker reads, so any login that may append could write to a trainer's fenced streams
(its checkpoints, its steps) as if it held the trainer's lease. Now `ledger_append` takes the secret the lease
was granted for (`p_fence_secret`, after the epoch) and refuses a fenced append whose secret's SHA-256 is not
the lease's `secret_sha256` (`RL410`, like a stale fence: the writer does not hold the lease); an unfenced
append passes NULL. The six-argument function is dropped: old code cannot append against this schema, and
says so by a missing function rather than by writing as anyone.

Revision ID: 0008
Revises: 0007
"""

import importlib

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

OLD_APPEND = "ledger_append(text, text, bigint, text[], text[], jsonb[])"
APPEND = "ledger_append(text, text, bigint, text, text[], text[], jsonb[])"
ROLES = ("rollout_worker", "rollout_sandbox")
SIGNATURE = "    p_stream text, p_fence_resource text, p_epoch bigint,\n"
LEASE_EPOCH = "    v_lease_epoch bigint;\n"
LEASE_LOOKUP = (
    "            SELECT l.epoch INTO v_lease_epoch FROM lease l WHERE l.resource = p_fence_resource FOR SHARE;\n"
)
EPOCH_CHECKED = "coalesce(v_lease_epoch::text, 'none'), p_epoch);\n            END IF;\n"
SECRET_CHECK = """            IF v_lease_secret IS DISTINCT FROM sha256(convert_to(coalesce(p_fence_secret, ''), 'UTF8')) THEN
                RAISE EXCEPTION USING ERRCODE = 'RL410',
                    MESSAGE = format('the writer does not hold lease %L: its secret is not the lease''s',
                                     p_fence_resource);
            END IF;
"""


def _seventh():  # noqa: ANN202 (a migration module, named with a leading digit)
    return importlib.import_module("rollout.ledger.migrations.versions.0007_lease_secrets_and_narrow_roles")


def _append_function() -> str:
    sql = _seventh()._append_function(narrowed=True)
    for anchor in (SIGNATURE, LEASE_EPOCH, LEASE_LOOKUP, EPOCH_CHECKED):
        assert anchor in sql, "ledger_append changed shape"
    sql = sql.replace("CREATE OR REPLACE FUNCTION ledger_append(", "CREATE FUNCTION ledger_append(", 1)
    sql = sql.replace(SIGNATURE, "    p_stream text, p_fence_resource text, p_epoch bigint, p_fence_secret text,\n", 1)
    sql = sql.replace(LEASE_EPOCH, LEASE_EPOCH + "    v_lease_secret bytea;\n", 1)
    lookup = LEASE_LOOKUP.replace("SELECT l.epoch INTO v_lease_epoch", "SELECT l.epoch, l.secret_sha256 INTO v_lease_epoch, v_lease_secret")
    sql = sql.replace(LEASE_LOOKUP, lookup, 1)
    return sql.replace(EPOCH_CHECKED, EPOCH_CHECKED + SECRET_CHECK, 1)  # a zombie hears its fence is stale


def _secure(function: str) -> None:
    grants = "".join(
        f"    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN\n"
        f"        EXECUTE 'GRANT EXECUTE ON FUNCTION {function} TO {role}';\n"
        "    END IF;\n"
        for role in ROLES
    )
    op.execute(f"""
DO $$
BEGIN
    -- Definer's rights need a fixed search path: the ledger's schema, and pg_temp last.
    EXECUTE format('ALTER FUNCTION {function} SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
    EXECUTE 'REVOKE ALL ON FUNCTION {function} FROM PUBLIC';
{grants}END
$$;
""")


def upgrade() -> None:
    op.execute(f"DROP FUNCTION {OLD_APPEND}")
    op.execute(_append_function())
    _secure(APPEND)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {APPEND}")
    op.execute(_seventh()._append_function(narrowed=True).replace("CREATE OR REPLACE", "CREATE", 1))
    _secure(OLD_APPEND)
