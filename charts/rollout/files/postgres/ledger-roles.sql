-- The ledger's logins on the chart's dev Postgres (templates/postgres.yaml), run by its superuser: at the first
-- start, from /docker-entrypoint-initdb.d (which runs only on an empty data volume), and by hand on an install
-- from before the logins (docs/deploy.md): it can run again, and sets each password again.
--
-- rollout owns the ledger's database and migrates it (its tables are its own, so it grants on them); the
-- migrations grant each service's login what it may do: rollout_gateway, rollout_runner, rollout_trainer and
-- rollout_serving (each appends only its own event kinds), rollout_worker (anything: the Ray pods),
-- rollout_reader (the dashboard) and rollout_sandbox (command hosts). None of them is a superuser or may
-- create roles or databases: the migrations find the roles made and only grant. rollout_evals logs in
-- nowhere: the runner, which hosts evals' activities, is a member of it.
-- The passwords come from the Postgres container's environment (its Secrets), read with psql's \getenv
-- (psql 15 or newer), never from an argument.
\set ON_ERROR_STOP on
\getenv owner_password LEDGER_OWNER_PASSWORD
\getenv worker_password LEDGER_WORKER_PASSWORD
\getenv reader_password LEDGER_READER_PASSWORD
\getenv sandbox_password LEDGER_SANDBOX_PASSWORD
\getenv gateway_password LEDGER_GATEWAY_PASSWORD
\getenv runner_password LEDGER_RUNNER_PASSWORD
\getenv trainer_password LEDGER_TRAINER_PASSWORD
\getenv serving_password LEDGER_SERVING_PASSWORD

DO $$
DECLARE
    login text;
BEGIN
    FOREACH login IN ARRAY ARRAY['rollout', 'rollout_worker', 'rollout_reader', 'rollout_sandbox', 'rollout_gateway',
                                 'rollout_runner', 'rollout_trainer', 'rollout_serving', 'rollout_evals'] LOOP
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
ALTER ROLE rollout_gateway LOGIN PASSWORD :'gateway_password';
ALTER ROLE rollout_runner LOGIN PASSWORD :'runner_password';
ALTER ROLE rollout_trainer LOGIN PASSWORD :'trainer_password';
ALTER ROLE rollout_serving LOGIN PASSWORD :'serving_password';
GRANT rollout_evals TO rollout_runner;

-- This database (POSTGRES_DB) is the owner's; since PostgreSQL 15 its public schema is its owner's too.
ALTER DATABASE :"DBNAME" OWNER TO rollout;
