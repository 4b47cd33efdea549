"""A live lease goes back only to a holder that proves it holds it; a reader and a sandbox role of their own.

Lease secrets. Holder strings are predictable (`{run}/{episode}`, a host's address, a trainer's name), so
until now any worker repeating one was granted the live lease again, under a new epoch that fenced the real
holder out. Every grant now stores the SHA-256 of a secret the claimer chose (`lease.secret_sha256`; the secret
itself never reaches the ledger), and:
- `ledger_claim(resource, holder, ttl, secret)` grants a lease that is free or lapsed to anyone, and a live one
  only to the same holder passing the same secret (a retried claim of the episode that holds it); the grant
  stores the new secret's hash. A secret shorter than 32 characters is refused (SQLSTATE 22023).
- `ledger_renew` and `ledger_release` match the secret too, so nobody can keep a dead holder's lease alive or
  expire a live holder's lease to claim it next.
The three-argument `ledger_claim` and the functions without a secret are dropped: a worker of the old code
cannot lease against this schema, and says so by a missing function rather than by granting blindly.

Narrow roles (made here when the migrator may create roles, as 0003 makes `rollout_worker`):
- `rollout_reader` may SELECT every ledger table and call no function: the dashboard connects as it.
- `rollout_sandbox` reads as the reader does and may call the ledger's functions, which refuse it any append
  but an unfenced `SandboxRegistered` on a sandbox pool stream (`sandboxes/…`) and any lease outside a sandbox
  host lease (`sandbox-host/…`): a sandbox host, which runs the policy's commands, cannot write a turn, a
  reward, a seat, a run's settings or an episode's claim, nor fence its pool's stream.
The functions tell the roles apart by `session_user` (the role that logged in; inside a SECURITY DEFINER
function `current_user` is the owner): a login granted `rollout_sandbox` is held to it too, unless it is also
a worker, a superuser or the owner.

Revision ID: 0007
Revises: 0006
"""

import importlib

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

READER = "rollout_reader"  # rollout.config.LEDGER_READER_ROLE
SANDBOX = "rollout_sandbox"  # rollout.config.LEDGER_SANDBOX_ROLE
TABLES = "event, stream, lease, run, seat"
MAX_TTL = "interval '1 day'"
MIN_SECRET = 32
APPEND = "ledger_append(text, text, bigint, text[], text[], jsonb[])"
SECRET_FUNCTIONS = (
    "ledger_claim(text, text, interval, text)",
    "ledger_renew(text, text, bigint, interval, text)",
    "ledger_release(text, text, bigint, text)",
)
OLD_FUNCTIONS = (
    "ledger_claim(text, text, interval)",
    "ledger_renew(text, text, bigint, interval)",
    "ledger_release(text, text, bigint)",
)
APPEND_ANCHOR = "    v_new bigint;\nBEGIN\n"
WORKER = "rollout_worker"
# Whether the login is a sandbox host: `rollout_sandbox` itself or a login granted it, unless it is also a
# worker, a superuser or the owner. Inside these SECURITY DEFINER functions `current_user` is the owner and
# `session_user` the login (SET ROLE does not change it). CASE keeps pg_has_role from naming a missing role.
IS_SANDBOX_HOST = f"""(CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = '{SANDBOX}')
         THEN pg_catalog.pg_has_role(session_user, '{SANDBOX}', 'MEMBER') ELSE false END
     AND session_user <> current_user
     AND NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = session_user), false)
     AND NOT CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = '{WORKER}')
         THEN pg_catalog.pg_has_role(session_user, '{WORKER}', 'MEMBER') ELSE false END)"""
# A sandbox host registers itself, and writes nothing else: no other kind (a `SeatOpened` on any stream would
# open a seat through the projections), no other stream, no fence (which would fence the pool's stream out).
SANDBOX_APPEND_CHECK = f"""    IF {IS_SANDBOX_HOST}
       AND (NOT starts_with(p_stream, 'sandboxes/') OR p_fence_resource IS NOT NULL
            OR EXISTS (SELECT 1 FROM unnest(p_kinds) AS k(kind) WHERE k.kind <> 'SandboxRegistered')) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('a sandbox host may append only unfenced SandboxRegistered events to sandbox pool '
                             'streams, not to %L', p_stream);
    END IF;
"""

# A lease statement is refused to a sandbox host outside its hosts' leases, and to anyone without a secret.
_GUARD = f"""    IF {IS_SANDBOX_HOST} AND NOT starts_with(p_resource, 'sandbox-host/') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('a sandbox host may hold only sandbox host leases, not %L', p_resource);
    END IF;
    IF p_secret IS NULL OR length(p_secret) < {MIN_SECRET} THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'a lease statement needs the holder''s secret, at least {MIN_SECRET} characters';
    END IF;
"""

SECRET_LEASE_FUNCTIONS = f"""
CREATE FUNCTION ledger_claim(p_resource text, p_holder text, p_ttl interval, p_secret text)
RETURNS TABLE (resource text, holder text, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
{_GUARD}    RETURN QUERY
    INSERT INTO lease AS l (resource, holder, epoch, expires_at, secret_sha256)
    VALUES (p_resource, p_holder, 1, now() + least(p_ttl, {MAX_TTL}), sha256(convert_to(p_secret, 'UTF8')))
    ON CONFLICT (resource) DO UPDATE
       SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at,
           secret_sha256 = EXCLUDED.secret_sha256
     WHERE l.expires_at <= now()
        OR (l.holder = EXCLUDED.holder AND l.secret_sha256 = EXCLUDED.secret_sha256)
    RETURNING l.resource, l.holder, l.epoch, l.expires_at;
END
$$;

CREATE FUNCTION ledger_renew(p_resource text, p_holder text, p_epoch bigint, p_ttl interval, p_secret text)
RETURNS TABLE (resource text, holder text, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
{_GUARD}    RETURN QUERY
    UPDATE lease AS l SET expires_at = now() + least(p_ttl, {MAX_TTL})
     WHERE l.resource = p_resource AND l.holder = p_holder AND l.epoch = p_epoch
       AND l.secret_sha256 = sha256(convert_to(p_secret, 'UTF8'))
    RETURNING l.resource, l.holder, l.epoch, l.expires_at;
END
$$;

CREATE FUNCTION ledger_release(p_resource text, p_holder text, p_epoch bigint, p_secret text)
RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
{_GUARD}    -- Releasing expires the lease but keeps its row: the next grant continues from this epoch.
    UPDATE lease AS l SET expires_at = now()
     WHERE l.resource = p_resource AND l.holder = p_holder AND l.epoch = p_epoch AND l.expires_at > now()
       AND l.secret_sha256 = sha256(convert_to(p_secret, 'UTF8'));
END
$$;
"""


def _roles_sql() -> str:
    functions = (APPEND, *SECRET_FUNCTIONS)
    return f"""
DO $$
DECLARE
    f text;
    r text;
BEGIN
    FOREACH f IN ARRAY ARRAY{list(functions)!r}::text[] LOOP
        -- Definer's rights need a fixed search path: the ledger's schema, and pg_temp last.
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rollout_worker') THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO rollout_worker', f);
        END IF;
    END LOOP;

    FOREACH r IN ARRAY ARRAY['{READER}', '{SANDBOX}'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN', r);
            EXCEPTION
                -- Roles are cluster-wide: a migration of another database on this server made it meanwhile.
                WHEN duplicate_object OR unique_violation THEN NULL;
                WHEN insufficient_privilege THEN
                    RAISE NOTICE 'the migrating user may not create roles: create % (LOGIN) and migrate again', r;
                    CONTINUE;
            END;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), r);
        EXECUTE format('GRANT SELECT ON {TABLES} TO %I', r);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SANDBOX}') THEN
        FOREACH f IN ARRAY ARRAY{list(functions)!r}::text[] LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {SANDBOX}', f);
        END LOOP;
    END IF;
END
$$;
"""


def _append_function(*, narrowed: bool) -> str:
    # 0006's text, edited: one place states the function (module names start with a digit).
    sixth = importlib.import_module("rollout.ledger.migrations.versions.0006_unfenced_appends_and_lease_ttls")
    sql = sixth._append_function(checked=True)
    if narrowed:
        assert APPEND_ANCHOR in sql, "ledger_append changed shape"
        sql = sql.replace(APPEND_ANCHOR, APPEND_ANCHOR + SANDBOX_APPEND_CHECK, 1)
    return sql


def upgrade() -> None:
    op.execute("ALTER TABLE lease ADD COLUMN secret_sha256 bytea")
    for function in OLD_FUNCTIONS:
        op.execute(f"DROP FUNCTION {function}")
    op.execute(SECRET_LEASE_FUNCTIONS)
    op.execute(_append_function(narrowed=True))
    op.execute(_roles_sql())


def downgrade() -> None:
    # The roles themselves stay (they belong to the whole server); they lose this database's rights.
    op.execute(f"""
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['{READER}', '{SANDBOX}'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('REVOKE ALL ON {TABLES} FROM %I', r);
            EXECUTE format('REVOKE ALL ON FUNCTION {APPEND} FROM %I', r);
            EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM %I', current_schema(), r);
        END IF;
    END LOOP;
END
$$;
""")
    for function in SECRET_FUNCTIONS:
        op.execute(f"DROP FUNCTION {function}")
    third = importlib.import_module("rollout.ledger.migrations.versions.0003_worker_role")
    sixth = importlib.import_module("rollout.ledger.migrations.versions.0006_unfenced_appends_and_lease_ttls")
    op.execute(third.LEASE_FUNCTIONS)
    op.execute(third.GRANTS)
    op.execute(sixth._lease_functions(f"least(p_ttl, interval '{sixth.MAX_TTL}')"))
    op.execute(_append_function(narrowed=False))
    sixth._secure()
    op.execute("ALTER TABLE lease DROP COLUMN secret_sha256")
