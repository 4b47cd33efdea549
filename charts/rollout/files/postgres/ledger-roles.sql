-- The ledger's logins on the chart's dev Postgres (templates/postgres.yaml), run by its superuser: at the first
-- start, from /docker-entrypoint-initdb.d (which runs only on an empty data volume), and by hand on an install
-- from before the logins (docs/deploy.md): it can run again, and sets each password again.
--
-- rollout owns the ledger's database and migrates it (its tables are its own, so it grants on them); the
-- migrations grant rollout_worker, rollout_reader and rollout_sandbox what each may do. None of them is a
-- superuser or may create roles or databases: the migrations find the roles made and only grant.
-- The passwords come from the Postgres container's environment (its Secrets), read with psql's \getenv
-- (psql 15 or newer), never from an argument.
\set ON_ERROR_STOP on
\getenv owner_password LEDGER_OWNER_PASSWORD
\getenv worker_password LEDGER_WORKER_PASSWORD
\getenv reader_password LEDGER_READER_PASSWORD
\getenv sandbox_password LEDGER_SANDBOX_PASSWORD

DO $$
DECLARE
    login text;
BEGIN
    FOREACH login IN ARRAY ARRAY['rollout', 'rollout_worker', 'rollout_reader', 'rollout_sandbox'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = login) THEN
            EXECUTE format('CREATE ROLE %I NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS', login);
        END IF;
    END LOOP;
END
$$;

ALTER ROLE rollout LOGIN PASSWORD :'owner_password';
ALTER ROLE rollout_worker LOGIN PASSWORD :'worker_password';
ALTER ROLE rollout_reader LOGIN PASSWORD :'reader_password';
ALTER ROLE rollout_sandbox LOGIN PASSWORD :'sandbox_password';

-- This database (POSTGRES_DB) is the owner's; since PostgreSQL 15 its public schema is its owner's too.
ALTER DATABASE :"DBNAME" OWNER TO rollout;
