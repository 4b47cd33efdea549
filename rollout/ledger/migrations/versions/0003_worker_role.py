"""The worker role: services write the ledger only through its functions, never by UPDATE or DELETE.

`rollout_worker` (made here when the migrator may create roles) may SELECT every ledger table and EXECUTE the
ledger's functions: `ledger_append` and the lease functions added here (`ledger_claim`, `ledger_renew`,
`ledger_release`). It holds no INSERT, UPDATE, DELETE or TRUNCATE on any table: the functions run with their
owner's rights (SECURITY DEFINER, with a pinned search_path so a caller's temporary tables cannot stand in for
the ledger's), so a worker can append events and advance leases exactly as the functions allow and do nothing
else. The append-only triggers of 0001 stay: they bind the owner too.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ROLE = "rollout_worker"  # rollout.config.LEDGER_WORKER_ROLE: the role a worker's derived ledger URL names
APPEND = "ledger_append(text, text, bigint, text[], text[], jsonb[])"
TABLES = "event, stream, lease, run, seat"

# The lease statements of rollout.ledger.store, as functions: a lease row only ever gains an epoch or moves its
# expiry, and these are the only ways a worker can change one.
LEASE_FUNCTIONS = r"""
CREATE FUNCTION ledger_claim(p_resource text, p_holder text, p_ttl interval)
RETURNS TABLE (resource text, holder text, epoch bigint, expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER AS $$
INSERT INTO lease AS l (resource, holder, epoch, expires_at) VALUES (p_resource, p_holder, 1, now() + p_ttl)
ON CONFLICT (resource) DO UPDATE
   SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
 WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder
RETURNING l.resource, l.holder, l.epoch, l.expires_at
$$;

CREATE FUNCTION ledger_renew(p_resource text, p_holder text, p_epoch bigint, p_ttl interval)
RETURNS TABLE (resource text, holder text, epoch bigint, expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER AS $$
UPDATE lease AS l SET expires_at = now() + p_ttl
 WHERE l.resource = p_resource AND l.holder = p_holder AND l.epoch = p_epoch
RETURNING l.resource, l.holder, l.epoch, l.expires_at
$$;

CREATE FUNCTION ledger_release(p_resource text, p_holder text, p_epoch bigint)
RETURNS void LANGUAGE sql SECURITY DEFINER AS $$
-- Releasing expires the lease but keeps its row: the next grant continues from this epoch.
UPDATE lease AS l SET expires_at = now()
 WHERE l.resource = p_resource AND l.holder = p_holder AND l.epoch = p_epoch AND l.expires_at > now()
$$;
"""

FUNCTIONS = (
    APPEND,
    "ledger_claim(text, text, interval)",
    "ledger_renew(text, text, bigint, interval)",
    "ledger_release(text, text, bigint)",
)

GRANTS = f"""
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY{list(FUNCTIONS)!r}::text[] LOOP
        -- Definer's rights need a fixed search path: the ledger's schema, and pg_temp last.
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;

    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
        BEGIN
            CREATE ROLE {ROLE} LOGIN;
        EXCEPTION
            -- Roles are cluster-wide: a migration of another database on this server made it meanwhile.
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'the migrating user may not create roles: create {ROLE} (LOGIN) and migrate again, '
                             'or give workers services.postgres.worker_url';
                RETURN;
        END;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO {ROLE}', current_schema());
    GRANT SELECT ON {TABLES} TO {ROLE};
    FOREACH f IN ARRAY ARRAY{list(FUNCTIONS)!r}::text[] LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {ROLE}', f);
    END LOOP;
END
$$;
"""

UNGRANTS = f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
        REVOKE ALL ON {TABLES} FROM {ROLE};
        REVOKE ALL ON FUNCTION {APPEND} FROM {ROLE};
        EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM {ROLE}', current_schema());
    END IF;
END
$$;
"""


def upgrade() -> None:
    op.execute(LEASE_FUNCTIONS)
    op.execute(GRANTS)


def downgrade() -> None:
    # The role itself stays: roles belong to the whole server, and another database may still grant it.
    op.execute(UNGRANTS)
    op.execute("DROP FUNCTION ledger_release(text, text, bigint)")
    op.execute("DROP FUNCTION ledger_renew(text, text, bigint, interval)")
    op.execute("DROP FUNCTION ledger_claim(text, text, interval)")
    op.execute(f"ALTER FUNCTION {APPEND} SECURITY INVOKER RESET search_path")
    op.execute(f"GRANT EXECUTE ON FUNCTION {APPEND} TO PUBLIC")
