"""A sandbox host reads what it runs on, its pools and the leases, not the ledger's transcripts.

A sandbox host runs the policy's commands, so it is the login most likely to be taken over. Until now
`rollout_sandbox` could SELECT every table: every turn's tokens, every reward, every seat and run. Now:
- it may not read `run`, `seat` or `stream` at all (a host reads its pool's events and leases only:
  rollout.sandbox.claims);
- `event` has row-level security. A permissive policy lets every role that may read the table see every row,
  as before; a restrictive one, for `rollout_sandbox` and the logins granted it, lets them see only the events
  of sandbox pool streams (`sandboxes/…`). The table's owner (the migrator, and the ledger's functions, which
  run with its rights) is not held to either, so appends are unchanged.
Where the migrating user could not make `rollout_sandbox` (0007), there is no sandbox login to narrow.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SANDBOX = "rollout_sandbox"  # rollout.config.LEDGER_SANDBOX_ROLE
POOLS = "sandboxes/"  # rollout.ledger.streams.sandbox_pool_stream
HIDDEN = "run, seat, stream"


def upgrade() -> None:
    op.execute("ALTER TABLE event ENABLE ROW LEVEL SECURITY")
    op.execute("CREATE POLICY readers_see_every_event ON event FOR SELECT TO PUBLIC USING (true)")
    op.execute(f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SANDBOX}') THEN
        CREATE POLICY sandbox_hosts_see_their_pools ON event AS RESTRICTIVE FOR SELECT TO {SANDBOX}
            USING (starts_with(stream_id, '{POOLS}'));
        REVOKE SELECT ON {HIDDEN} FROM {SANDBOX};
    END IF;
END
$$;
""")


def downgrade() -> None:
    op.execute("DROP POLICY IF EXISTS sandbox_hosts_see_their_pools ON event")
    op.execute("DROP POLICY readers_see_every_event ON event")
    op.execute("ALTER TABLE event DISABLE ROW LEVEL SECURITY")
    op.execute(f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SANDBOX}') THEN
        GRANT SELECT ON {HIDDEN} TO {SANDBOX};
    END IF;
END
$$;
""")
