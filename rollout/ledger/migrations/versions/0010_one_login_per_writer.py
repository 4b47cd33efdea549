"""One login per writer kind: each service appends only its own event kinds and holds only its own leases.

Until now every service wrote as `rollout_worker`, which may append anything: a taken-over gateway, runner,
trainer or engine could open seats, record turns and rewards, change a run's settings or publish checkpoints.
Now each kind of service logs in as its own role (made here when the migrator may create roles, as 0007 makes
its roles), and the ledger's functions hold it to what that kind writes:

| role | appends (event kind on streams starting with) | leases (resources starting with) |
|---|---|---|
| `rollout_gateway` | `TurnRecorded` on `seat/`; `SeatOpened` on `seat/manual/` (operator seats) | none |
| `rollout_runner` | a run's `RunCreated`, `RunLaunched`, `SettingsChanged`, `EpisodeFinished`, `EpisodeAbandoned` on `run/`; `SeatOpened`, `SeatClosed` on `seat/`; and whatever `rollout_evals` may | `sandbox/` |
| `rollout_evals` | `EvalResult`, `EvalGateDecided` on `evals/`; `ServingRequested`, `ServingReleased` on `serving/requests` | none |
| `rollout_trainer` | `BatchAssembled` on `run/`; `CheckpointCreated`, `CheckpointConverted` on `policy/`; `ServingTarget` on `serving/targets` | `trainer/`, `gpu/` |
| `rollout_serving` | `ServingAck` on `serving/acks` | none |

The rights are rows of `writer_right` and `lease_right` (role, kind, stream prefix; role, resource prefix),
readable by every ledger role. A login is held to them when it is a member of any writer role, unless it is
also `rollout_worker` (which keeps writing anything: a server of the user's own without per-kind logins), a
superuser or the functions' owner: its append is refused (SQLSTATE 42501) unless every event's kind is one its
roles may append to a stream with that prefix, and its lease statement unless the resource has one of its
roles' prefixes. Membership counts, as for the sandbox role: a login granted `rollout_trainer` is a trainer,
and `rollout_runner` is granted `rollout_evals` because the runner worker hosts evals' activities.

Revision ID: 0010
Revises: 0009
"""

import importlib

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

WORKER = "rollout_worker"  # rollout.config.LEDGER_WORKER_ROLE
TABLES = "event, stream, lease, run, seat, writer_right, lease_right"
FUNCTIONS = (
    "ledger_append(text, text, bigint, text, text[], text[], jsonb[])",
    "ledger_claim(text, text, interval, text)",
    "ledger_renew(text, text, bigint, interval, text)",
    "ledger_release(text, text, bigint, text)",
)
# role → [(event kind, stream prefix)]; rollout.config.LedgerWriter names the roles.
WRITES: dict[str, list[tuple[str, str]]] = {
    "rollout_gateway": [("TurnRecorded", "seat/"), ("SeatOpened", "seat/manual/")],
    "rollout_runner": [
        *((kind, "run/") for kind in ("RunCreated", "RunLaunched", "SettingsChanged")),
        *((kind, "run/") for kind in ("EpisodeFinished", "EpisodeAbandoned")),
        ("SeatOpened", "seat/"),
        ("SeatClosed", "seat/"),
    ],
    "rollout_evals": [
        ("EvalResult", "evals/"),
        ("EvalGateDecided", "evals/"),
        ("ServingRequested", "serving/requests"),
        ("ServingReleased", "serving/requests"),
    ],
    "rollout_trainer": [
        ("BatchAssembled", "run/"),
        ("CheckpointCreated", "policy/"),
        ("CheckpointConverted", "policy/"),
        ("ServingTarget", "serving/targets"),
    ],
    "rollout_serving": [("ServingAck", "serving/acks")],
}
LEASES: dict[str, list[str]] = {"rollout_runner": ["sandbox/"], "rollout_trainer": ["trainer/", "gpu/"]}
# A role that holds another's rights: the runner worker hosts evals' activities (rollout.workers.runner).
MEMBERSHIPS = (("rollout_evals", "rollout_runner"),)

# Whether the login is held to the writer rights: a member of a writer role, and none of the worker, a
# superuser or the owner (inside these SECURITY DEFINER functions `current_user` is the owner and
# `session_user` the login). Rights join pg_roles so pg_has_role never meets a role that is missing.
HELD = f"""(session_user <> current_user
     AND NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = session_user), false)
     AND NOT CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = '{WORKER}')
         THEN pg_catalog.pg_has_role(session_user, '{WORKER}', 'MEMBER') ELSE false END
     AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname IN ({", ".join(f"'{r}'" for r in WRITES)})
                   AND pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')))"""
APPEND_CHECK = f"""    IF {HELD}
       AND EXISTS (SELECT 1 FROM unnest(p_kinds) AS k(kind) WHERE NOT EXISTS (
           SELECT 1 FROM writer_right w JOIN pg_catalog.pg_roles r ON r.rolname = w.role
            WHERE w.kind = k.kind AND starts_with(p_stream, w.stream_prefix)
              AND pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER'))) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('login %I may not append %s to %L: each service appends only its own event kinds',
                             session_user, array_to_string(p_kinds, ', '), p_stream);
    END IF;
"""
LEASE_CHECK = f"""    IF {HELD}
       AND NOT EXISTS (SELECT 1 FROM lease_right l JOIN pg_catalog.pg_roles r ON r.rolname = l.role
                        WHERE starts_with(p_resource, l.resource_prefix)
                          AND pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('login %I may not hold lease %L: each service holds only its own leases',
                             session_user, p_resource);
    END IF;
"""


def _version(name: str):  # noqa: ANN202 (migration modules are named with a leading digit)
    return importlib.import_module(f"rollout.ledger.migrations.versions.{name}")


def _append_function(*, checked: bool) -> str:
    seventh = _version("0007_lease_secrets_and_narrow_roles")
    sql = _version("0008_fenced_appends_prove_the_lease")._append_function()
    sql = sql.replace("CREATE FUNCTION ledger_append(", "CREATE OR REPLACE FUNCTION ledger_append(", 1)
    sandbox_checked = seventh.APPEND_ANCHOR + seventh.SANDBOX_APPEND_CHECK
    assert sandbox_checked in sql, "ledger_append changed shape"
    return sql.replace(sandbox_checked, sandbox_checked + APPEND_CHECK, 1) if checked else sql


def _lease_functions(*, checked: bool) -> str:
    seventh = _version("0007_lease_secrets_and_narrow_roles")
    sql = seventh.SECRET_LEASE_FUNCTIONS.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    assert sql.count(seventh._GUARD) == 3, "the lease functions changed shape"
    return sql.replace(seventh._GUARD, seventh._GUARD + LEASE_CHECK) if checked else sql


def _secure() -> None:
    for function in FUNCTIONS:  # CREATE OR REPLACE resets them; the grants stay
        op.execute(
            f"DO $$ BEGIN EXECUTE format('ALTER FUNCTION {function} SECURITY DEFINER SET search_path = %I, "
            "pg_temp', current_schema()); END $$;"
        )


def _rights_sql() -> str:
    writes = ", ".join(f"('{role}', '{kind}', '{prefix}')" for role, rights in WRITES.items() for kind, prefix in rights)
    leases = ", ".join(f"('{role}', '{prefix}')" for role, prefixes in LEASES.items() for prefix in prefixes)
    return f"""
CREATE TABLE writer_right (role text NOT NULL, kind text NOT NULL, stream_prefix text NOT NULL,
                           PRIMARY KEY (role, kind, stream_prefix));
CREATE TABLE lease_right (role text NOT NULL, resource_prefix text NOT NULL, PRIMARY KEY (role, resource_prefix));
INSERT INTO writer_right VALUES {writes};
INSERT INTO lease_right VALUES {leases};
"""


def _roles_sql() -> str:
    grants = "".join(
        f"""    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{granted}')
       AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{member}')
       AND NOT pg_has_role('{member}', '{granted}', 'MEMBER') THEN
        BEGIN
            GRANT {granted} TO {member};
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'the migrating user may not grant roles: GRANT {granted} TO {member}, as a superuser';
        END;
    END IF;
"""
        for granted, member in MEMBERSHIPS
    )
    return f"""
DO $$
DECLARE
    f text;
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY{list(WRITES)!r}::text[] LOOP
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
        FOREACH f IN ARRAY ARRAY{list(FUNCTIONS)!r}::text[] LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, r);
        END LOOP;
    END LOOP;
{grants}    -- Every role that reads the ledger may read the rights (a login learns what it may write).
    FOREACH r IN ARRAY ARRAY['{WORKER}', 'rollout_reader', 'rollout_sandbox']::text[] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('GRANT SELECT ON writer_right, lease_right TO %I', r);
        END IF;
    END LOOP;
END
$$;
"""


def upgrade() -> None:
    op.execute(_rights_sql())
    op.execute(_append_function(checked=True))
    op.execute(_lease_functions(checked=True))
    _secure()
    op.execute(_roles_sql())


def downgrade() -> None:
    # The roles themselves stay (they belong to the whole server); they lose this database's rights.
    revokes = "".join(
        f"""    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
        EXECUTE format('REVOKE ALL ON event, stream, lease, run, seat FROM %I', '{role}');
        EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM %I', current_schema(), '{role}');
{"".join(f"        REVOKE ALL ON FUNCTION {f} FROM {role};{chr(10)}" for f in FUNCTIONS)}    END IF;
"""
        for role in WRITES
    )
    op.execute(f"DO $$\nBEGIN\n{revokes}END\n$$;")
    op.execute(_append_function(checked=False))
    op.execute(_lease_functions(checked=False))
    _secure()
    op.execute("DROP TABLE writer_right, lease_right")
