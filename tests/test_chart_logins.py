"""The chart's ledger logins: each pod logs in to the ledger as its own role with its own Secret's password,
no pod but Postgres's sees the superuser's, one sandbox key Secret reaches the runners only, and the dev
Postgres's init script, run on a real server, makes those logins without privileges that the owner then
migrates as."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import psycopg
import pytest

from rollout.config import load
from rollout.ledger import migrate
from rollout.net import free_port
from rollout.sandbox.keys import kind_key
from rollout.stack.postgres import EmbeddedPostgres, binaries_dir
from tests.test_chart import (
    CHART,
    VALUES,
    containers,
    objects_of,
    pod_templates,
    rendered,
    secret_refs,
    secrets_of,
    values_of,
)

SERVICE_LOGINS = ("gateway", "runner", "trainer", "serving", "worker", "reader", "sandbox")
PASSWORD_KEYS = {
    "postgres": "postgresPassword",
    "owner": "databasePassword",
    **{login: f"{login}Password" for login in SERVICE_LOGINS},
}
# Each component's login; a trainer or engine placed on Ray runs in a Ray pod, as the worker (below).
COMPONENT_LOGINS = {
    "monitor": "reader",
    "commandhost": "sandbox",
    "gateway": "gateway",
    "runner": "runner",
    "trainer": "trainer",
    "engine": "serving",
}


def _login_of(component: str, container: dict[str, Any]) -> str | None:
    """The ledger login a container should use: the migration's the owner, the dashboard's the reader, a
    command host's the sandbox role, each writer kind's its own (the engines': serving), the model pull and
    the other services' containers none, the dev Postgres its superuser, a Ray pod (or a role placed on Ray)
    the worker."""
    if component == "postgres":
        return "postgres"
    if container["name"] == "models" or not container["image"].split(":")[0].endswith(("/rollout", "-gpu")):
        return None
    if container["name"] == "migrate":
        return "owner"
    arguments = list(map(str, container.get("args", [])))
    if "--placement" in arguments and arguments[arguments.index("--placement") + 1] == "ray":
        return "worker"
    return COMPONENT_LOGINS.get(component, "worker")


def _password_ref(container: dict[str, Any], variable: str = "PGPASSWORD") -> tuple[str, str] | None:
    for env in container.get("env", []):
        if env["name"] == variable:
            assert "value" not in env, f"{container['name']}: {variable} is written out"
            ref = env["valueFrom"]["secretKeyRef"]
            return ref["name"], ref["key"]
    return None


@pytest.mark.parametrize("name", VALUES)
def test_each_container_logs_in_to_the_ledger_as_its_own_role_with_its_own_secret(name: str) -> None:
    """The owner's URL and password reach only the migrations, the dashboard reads as rollout_reader, each
    writer kind as its own role, the Ray pods as rollout_worker; each password is its login's own Secret (or
    the existing Secret)."""
    objects = rendered(name)
    existing = values_of(name).get("secrets", {}).get("existingSecret")
    owner = urlsplit(
        values_of(name).get("services", {}).get("postgres", {}).get("url") or "//rollout@"
    ).username
    logins: dict[str, set[str]] = {}
    for component, template in pod_templates(objects):
        spec = template["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            login = _login_of(component, container)
            logins.setdefault(login or "-", set()).add(f"{component}/{container['name']}")
            if login == "postgres":
                continue
            ref = _password_ref(container)
            if login is None:
                assert ref is None, f"{component}/{container['name']} uses no ledger but gets a password"
            else:
                assert ref == (existing or f"demo-rollout-ledger-{login}", PASSWORD_KEYS[login]), (
                    f"{component}/{container['name']}"
                )
            if "args" not in container:
                continue
            overrides = [a for a in map(str, container["args"]) if "=" in a and not a.startswith("-")]
            postgres = load(overrides).services.postgres
            urls = {
                "owner": postgres.url,
                **{login: getattr(postgres, f"{login}_url") for login in SERVICE_LOGINS},
            }
            given = {key: url for key, url in urls.items() if url}
            where = f"{component}/{container['name']}: {given}"
            if login is None:
                assert not given, where
            elif login == "owner":
                assert given.keys() == {"owner"} and urlsplit(given["owner"]).username == owner, where
            elif login == "reader":  # as both: the dashboard reads worker_url until it reads reader_url
                assert given.keys() == {"reader", "worker"}, where
                assert {urlsplit(u).username for u in given.values()} == {"rollout_reader"}, where
            else:
                assert given.keys() == {login}, where
                assert urlsplit(given[login]).username == f"rollout_{login}", where
            assert all(urlsplit(url).password is None for url in given.values()), where
    assert {c.split("/")[1] for c in logins["owner"]} == {"migrate"}
    # Only the Ray pods, and roles placed on Ray, log in as the worker that writes anything.
    assert {c.split("/")[0] for c in logins.get("worker", ())} <= {
        "ray-head",
        "ray-worker",
        "trainer",
        "engine",
    }
    if name == "default":  # its engine and trainer are placed on Ray (tests/test_chart_wiring.py: as pods)
        for component in ("gateway", "runner", "monitor", "commandhost"):
            assert f"{component}/{component}" in logins[COMPONENT_LOGINS[component]], (component, logins)
    if name != "multi-node":
        assert logins["reader"] == {"monitor/monitor"}
    if existing:
        assert not secrets_of(objects), "an existing Secret is used, none is made"
        return
    secrets = secrets_of(objects)
    for login, key in PASSWORD_KEYS.items():  # one Secret per login, holding its password and nothing else
        if login == "postgres" and name == "multi-node":
            assert "demo-rollout-postgres" not in secrets, "no dev Postgres, no superuser password"
            continue
        secret = secrets["demo-rollout-postgres" if login == "postgres" else f"demo-rollout-ledger-{login}"]
        assert secret.keys() == {key} and len(secret[key]) >= 32
    assert not set(PASSWORD_KEYS.values()) & secrets["demo-rollout-secrets"].keys()


def test_an_external_servers_roles_are_its_url_as_each_role_unless_given() -> None:
    """With a server of your own, each role's URL is the owner's server and database (its options kept) as
    that role, or the URL given for it."""
    owner = "postgresql://ledger_admin@db.example:6432/ledger?sslmode=require"
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(
            {"services": {"postgres": {"url": owner, "reader_url": "postgresql://dash@ro.example/ledger"}}},
            name="demo",
            namespace="rollout",
        )
    objects = objects_of(manifests)
    assert not any(o["kind"] == "StatefulSet" for o in objects), "no dev Postgres"
    told: dict[str, set[str]] = {}
    for _, container in containers(objects):
        for argument in map(str, container.get("args", [])):
            if argument.startswith("services.postgres."):
                setting, url = argument.split("=", 1)
                told.setdefault(setting.removeprefix("services.postgres."), set()).add(url.strip("'"))
    assert told["url"] == {owner}
    assert told["worker_url"] == {
        "postgresql://rollout_worker@db.example:6432/ledger?sslmode=require",  # the engine and trainer, on Ray
        "postgresql://dash@ro.example/ledger",  # the dashboard's, until it reads reader_url
    }
    assert told["reader_url"] == {"postgresql://dash@ro.example/ledger"}
    for writer in ("gateway", "runner"):
        assert told[f"{writer}_url"] == {
            f"postgresql://rollout_{writer}@db.example:6432/ledger?sslmode=require"
        }


def test_no_pod_but_postgres_sees_the_superuser_password_and_none_is_written_out() -> None:
    """The superuser's Secret is the Postgres pod's alone, the owner's the migrations' (and Postgres's, which
    makes the logins). No Secret's value is in an argument, an environment value or a ConfigMap, and no URL
    given as a setting carries a password."""
    for name in VALUES:
        objects = rendered(name)
        for component, template in pod_templates(objects):
            refs = secret_refs(template)
            if component != "postgres":
                assert not {r for r in refs if r[1] == "postgresPassword" or r[0].endswith("-postgres")}, (
                    component
                )
        values = [v for secret in secrets_of(objects).values() for v in secret.values() if len(v) >= 16]
        written = [
            str(a) for _, c in containers(objects) for a in [*c.get("args", []), *c.get("command", [])]
        ]
        written += [str(e["value"]) for _, c in containers(objects) for e in c.get("env", []) if "value" in e]
        written += [text for o in objects if o["kind"] == "ConfigMap" for text in o["data"].values()]
        assert not [v for v in values if any(v in w for w in written)], name
        for argument in written:
            for url in re.findall(r"postgres(?:ql)?://[^'\s]+", argument):
                assert urlsplit(url).password is None, url
        for _, container in containers(objects):
            for env in container.get("env", []):
                if re.search(r"PASSWORD|KEY|TOKEN|SECRET", env["name"]):
                    assert "secretKeyRef" in env.get("valueFrom", {}), (container["name"], env["name"])
    (postgres,) = [t for c, t in pod_templates(rendered("default")) if c == "postgres"]
    assert _password_ref(postgres["spec"]["containers"][0], "POSTGRES_PASSWORD") == (
        "demo-rollout-postgres",
        "postgresPassword",
    )
    env = {e["name"]: e for e in postgres["spec"]["containers"][0]["env"]}
    assert env["POSTGRES_USER"]["value"] == "postgres", "the superuser is not the ledger's owner"


def test_one_sandbox_key_secret_is_mounted_into_the_runners_and_command_hosts_only() -> None:
    """Runners prove sandbox claims with the key sandbox hosts check them with: every runner and command host
    (and any host outside the release) must hold the same one, not a key each made in its own emptyDir."""
    objects = rendered("default")
    holders = [name for name, secret in secrets_of(objects).items() if "sandboxKey" in secret]
    assert holders == ["demo-rollout-sandbox-key"]
    keys = secrets_of(objects)["demo-rollout-sandbox-key"]
    assert keys.keys() == {"sandboxKey", "commandKey"}
    master, command = (keys[k].encode() for k in ("sandboxKey", "commandKey"))
    assert command == kind_key(master, "command"), "a command host's key is the one runners derive"
    commandhost = dict(pod_templates(objects))["commandhost"]
    (container,) = commandhost["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "sandbox-key"]
    assert (mount["mountPath"], mount["subPath"]) == ("/data/sandbox-command.key", "commandKey")
    mounted = set()
    for component, template in pod_templates(objects):
        if ("demo-rollout-sandbox-key", "sandboxKey") in secret_refs(template):
            mounted.add(component)
            volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
            (container,) = template["spec"]["containers"]
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/data/sandbox.key"]
            assert volumes[mount["name"]]["secret"]["secretName"] == "demo-rollout-sandbox-key"
            assert mount["subPath"] == "sandboxKey" and mount["readOnly"]
    assert mounted == {"runner"}, (
        "the trainer, the gateway, the engines and the command hosts have no use for it"
    )


def test_the_dev_postgres_init_script_makes_the_logins_the_owner_migrates_with(tmp_path: Path) -> None:
    """The init script, as the Postgres pod runs it (its ConfigMap at /docker-entrypoint-initdb.d, the
    passwords from the pod's Secret references), on a real server: it makes the owner and the three roles,
    none a superuser or able to create roles or databases; it can run again (an upgrade's one-off run); and
    the owner, not a superuser, then migrates the ledger and grants the worker its rights."""
    objects = rendered("default")
    (template,) = [t for c, t in pod_templates(objects) if c == "postgres"]
    (container,) = template["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/docker-entrypoint-initdb.d"]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    (config_map,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]
    ]
    (script,) = config_map["data"].values()
    assert script.strip() == (CHART / "files" / "postgres" / "ledger-roles.sql").read_text().strip()
    statements = re.sub(r"--[^\n]*", "", script).upper()
    words = re.findall(r"\b(NO)?(SUPERUSER|CREATEROLE|CREATEDB|BYPASSRLS|REPLICATION)\b", statements)
    assert words and all(no for no, _ in words), "no login is given a privilege"
    secrets = secrets_of(objects)
    passwords = {}
    for env in container["env"]:
        if env["name"].startswith("LEDGER_"):
            secret, key = _password_ref(container, env["name"]) or ("", "")
            passwords[env["name"]] = secrets[secret][key]
    assert passwords.keys() == {f"LEDGER_{login.upper()}_PASSWORD" for login in ("owner", *SERVICE_LOGINS)}

    postgres = EmbeddedPostgres(tmp_path, "127.0.0.1", free_port())
    postgres.start()
    try:
        with psycopg.connect(postgres.url(), autocommit=True) as superuser:
            superuser.execute("CREATE DATABASE rollout")  # POSTGRES_DB
        (tmp_path / "ledger-roles.sql").write_text(script)
        for _ in range(2):  # at the first start, and again by hand after an upgrade
            superuser_url = postgres.url("rollout")
            done = subprocess.run(
                [str(binaries_dir() / "psql"), "-X", "-q", "-f", str(tmp_path / "ledger-roles.sql")],
                env={
                    **os.environ,
                    **passwords,
                    "PGHOST": "127.0.0.1",
                    "PGPORT": str(postgres.port),
                    "PGUSER": "postgres",
                    "PGDATABASE": "rollout",
                    "PGPASSWORD": urlsplit(superuser_url).password or "",
                },
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
        with psycopg.connect(postgres.url("rollout")) as superuser:
            roles = superuser.execute(
                "SELECT rolname, rolcanlogin, rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls"
                " OR rolreplication FROM pg_roles WHERE rolname LIKE 'rollout%' ORDER BY rolname"
            ).fetchall()
            logins = ["rollout", *(f"rollout_{login}" for login in SERVICE_LOGINS)]
            # rollout_evals logs in nowhere: the runner, which hosts evals' activities, is a member of it.
            assert roles == sorted(
                [*((role, True, False) for role in logins), ("rollout_evals", False, False)]
            )
            owner = superuser.execute(
                "SELECT datdba::regrole::text FROM pg_database WHERE datname = 'rollout'"
            )
            assert owner.fetchone() == ("rollout",)

        def url(role: str, login: str) -> str:
            password = passwords[f"LEDGER_{login.upper()}_PASSWORD"]
            return f"postgresql://{role}:{password}@127.0.0.1:{postgres.port}/rollout"

        migrate.upgrade(url("rollout", "owner"))  # roles exist: the migrations only grant
        with psycopg.connect(url("rollout_worker", "worker")) as worker:
            rights = worker.execute(
                "SELECT has_table_privilege('event', 'SELECT'), has_table_privilege('event', 'INSERT'),"
                " has_function_privilege("
                "'ledger_append(text, text, bigint, text, text[], text[], jsonb[])', 'EXECUTE')"
            ).fetchone()
            assert rights == (True, False, True)
        for role, login in (("rollout_reader", "reader"), ("rollout_sandbox", "sandbox")):
            with psycopg.connect(url(role, login)) as connection:  # each logs in with its own password
                assert connection.execute("SELECT current_user").fetchone() == (role,)
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(url("rollout_reader", "worker")).close()
        # The owner may not grant roles: the script made the runner a member of evals, so the runner's login
        # records eval results, and is held to its kinds all the same.
        append = (
            "SELECT appended FROM ledger_append(%s, NULL, 0, NULL, ARRAY['k'], ARRAY[%s], ARRAY['{}'::jsonb])"
        )
        with psycopg.connect(url("rollout_runner", "runner"), autocommit=True) as runner:
            assert runner.execute(append, ("evals/s/results", "EvalResult")).fetchone() == (True,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only its own event kinds"):
                runner.execute(append, ("seat/r/e/a", "TurnRecorded"))
    finally:
        postgres.remove()
