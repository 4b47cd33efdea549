"""The Helm chart, checked offline: `helm lint`, rendering with each values file, every object validated
strictly against the Kubernetes schemas, the RayCluster against KubeRay's CRD, and every command a container
runs exists in the CLI and takes the settings the chart gives it. Each pod logs in to the ledger as its own
role with its own Secret's password, and the dev Postgres's init script, run on a real server, makes those
logins without privileges that the owner then migrates as.

Helm itself comes from helm-python-sdk (Helm's Go SDK through a C library: no helm binary, no cluster).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import jsonschema
import kubernetes_validate
import psycopg
import pytest
import yaml

from rollout.config import Settings, load
from rollout.ledger import migrate
from rollout.net import free_port
from rollout.stack.postgres import EmbeddedPostgres, binaries_dir

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "rollout"
VALUES = {"default": None, "k3s": CHART / "values-k3s.yaml", "multi-node": CHART / "values-multinode.yaml"}
KUBERNETES_VERSION = "1.33.0"


def values_of(name: str) -> dict[str, Any]:
    path = VALUES[name]
    return yaml.safe_load(path.read_text()) if path else {}


@cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values_of(name), name="demo", namespace="rollout")
    return tuple(doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc)


def pod_templates(objects: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, Any]]]:
    """Every pod template, with the component its pods are (the Ray cluster's: ray-head and ray-worker)."""
    found: list[tuple[str, dict[str, Any]]] = []
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            found.append((obj["metadata"]["labels"]["app.kubernetes.io/component"], obj["spec"]["template"]))
        if obj["kind"] == "RayCluster":
            found.append(("ray-head", obj["spec"]["headGroupSpec"]["template"]))
            found.extend(("ray-worker", g["template"]) for g in obj["spec"].get("workerGroupSpecs", []))
    return found


def containers(objects: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for obj in objects:
        templates = []
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            templates.append(obj["spec"]["template"])
        if obj["kind"] == "RayCluster":
            templates.append(obj["spec"]["headGroupSpec"]["template"])
            templates.extend(group["template"] for group in obj["spec"].get("workerGroupSpecs", []))
        for template in templates:
            spec = template["spec"]
            found.extend(
                (obj["metadata"]["name"], c) for c in [*spec.get("initContainers", []), *spec["containers"]]
            )
    return found


def secrets_of(objects: tuple[dict[str, Any], ...]) -> dict[str, dict[str, str]]:
    """The Secrets the chart makes: name -> key -> value."""
    return {
        o["metadata"]["name"]: {k: base64.b64decode(v or "").decode() for k, v in o["data"].items()}
        for o in objects
        if o["kind"] == "Secret"
    }


@pytest.mark.parametrize("name", VALUES)
def test_helm_lint_passes(name: str) -> None:
    report = helm.lint(str(CHART), values=values_of(name))
    assert not report["errors"], report
    assert all(m["severity"] <= 1 for m in report["messages"]), report["messages"]  # info only (no icon)


@pytest.mark.parametrize("name", VALUES)
def test_every_rendered_object_is_valid_kubernetes_and_the_raycluster_matches_kuberay(name: str) -> None:
    objects = rendered(name)
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "Service", "ConfigMap", "RayCluster", "NetworkPolicy", "ServiceAccount"} <= kinds
    raycluster_schema = json.loads((ROOT / "tests" / "schemas" / "raycluster-v1.schema.json").read_text())
    for obj in objects:
        if obj["kind"] == "RayCluster":
            jsonschema.validate(obj, raycluster_schema)
            groups = [obj["spec"]["headGroupSpec"], *obj["spec"].get("workerGroupSpecs", [])]
            for group in groups:  # each pod template is a Kubernetes PodTemplateSpec
                pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
                kubernetes_validate.validate(
                    {**pod_template, "template": group["template"]}, KUBERNETES_VERSION, strict=True
                )
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_a_misplaced_field() -> None:
    """The validation is not vacuous: a field in the wrong place fails, in Kubernetes' schema and
    KubeRay's."""
    deployment = next(obj for obj in rendered("default") if obj["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["argz"] = ["gateway"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    raycluster = next(obj for obj in rendered("default") if obj["kind"] == "RayCluster")
    raycluster = json.loads(json.dumps(raycluster))
    raycluster["spec"]["workerGroupSpecs"][0]["gpus"] = 1
    schema = json.loads((ROOT / "tests" / "schemas" / "raycluster-v1.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raycluster, schema)


def test_the_k3s_values_fit_one_gpu_and_the_multinode_values_use_external_services() -> None:
    k3s = rendered("k3s")
    workers = [g for o in k3s if o["kind"] == "RayCluster" for g in o["spec"]["workerGroupSpecs"]]
    gpus = [g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for g in workers]
    assert sum(gpus) == 1, "one GPU in all"
    assert {o["kind"] for o in k3s} >= {"StatefulSet"}, "the dev Postgres runs in the cluster"
    multinode = rendered("multi-node")
    names = {
        o["metadata"]["name"] for o in multinode if o["kind"] in ("Deployment", "StatefulSet", "Service")
    }
    assert not {"demo-rollout-postgres", "demo-rollout-temporal", "demo-rollout-minio"} & names
    assert not any(o["kind"] == "Secret" for o in multinode), "an existing Secret is used, none is made"


@cache
def help_of(subcommand: tuple[str, ...]) -> str | None:
    """`rollout SUBCOMMAND --help` (the CLI in this process: the same parser, without a start-up per call), or
    None when there is no such command."""
    from typer.testing import CliRunner

    from rollout.cli.app import app

    helped = CliRunner().invoke(app, [*subcommand, "--help"], terminal_width=200)
    return helped.output if helped.exit_code == 0 else None


@pytest.mark.parametrize("name", VALUES)
def test_every_command_a_container_runs_exists_and_takes_the_charts_settings(name: str) -> None:
    seen = 0
    for owner, container in containers(rendered(name)):
        if (
            not container["image"].split(":")[0].endswith(("/rollout", "/rollout-gpu"))
            or "args" not in container
        ):
            continue
        args = [str(a) for a in container["args"]]
        command = [a for a in args if not a.startswith("-") and "=" not in a]
        subcommand = command[: 2 if command[0] in ("worker", "engine", "ledger", "models") else 1]
        helped = help_of(tuple(subcommand))
        assert helped is not None, f"{owner}: `rollout {' '.join(subcommand)}` is not a command"
        for option in (a for a in args if a.startswith("--")):
            assert option in helped, f"{owner}: `rollout {' '.join(subcommand)}` has no {option}"
        # The settings compose (secrets arrive as $(VAR), which Kubernetes expands from the environment).
        overrides = [re.sub(r"\$\((\w+)\)", "secret", a) for a in args if "=" in a and not a.startswith("-")]
        settings = load(overrides)
        assert settings.services.temporal.address
        seen += 1
    assert seen >= 8, "gateway, runner, engine, trainer, monitor, and their migrations and model pulls"


def test_values_schema_refuses_a_misspelt_key_and_a_bad_value() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(values_of("k3s"))
        with pytest.raises(helm.HelmError, match="gatway"):
            chart.validate_schema({"gatway": {"replicas": 2}})
        with pytest.raises(helm.HelmError):
            chart.validate_schema({"trainer": {"gpuMode": "sometimes"}})
        # What the schema cannot say, the templates refuse: an engine on Ray needs its worker group, and a pod
        # takes whole GPUs.
        with pytest.raises(helm.HelmError, match=r"engine\.rayGroup"):
            chart.render({"engine": {"rayGroup": ""}}, name="demo", namespace="rollout")
        with pytest.raises(helm.HelmError, match="whole number"):
            chart.render({"trainer": {"placement": "pod", "gpus": 0.5}}, name="demo", namespace="rollout")


def test_the_migration_job_command_migrates_a_ledger_and_explains_an_unreachable_one(
    stack_settings: Settings,
) -> None:
    migrated = subprocess.run(
        ["rollout", "ledger", "migrate", f"services.postgres.url={stack_settings.ledger_url}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("ledger at schema ")
    unreachable = f"postgresql://rollout@127.0.0.1:{free_port()}/rollout"
    refused = subprocess.run(
        ["rollout", "ledger", "migrate", "--wait-s", "1", f"services.postgres.url={unreachable}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1 and "did not answer within 1 s" in refused.stderr
    assert "Traceback" not in refused.stderr


def _secret_refs(template: dict[str, Any]) -> set[tuple[str, str]]:
    """The (Secret, key) pairs a pod template can read: through its containers' environment and its
    volumes."""
    spec = template["spec"]
    every = [*spec.get("initContainers", []), *spec["containers"]]
    assert not any("envFrom" in c for c in every), "no container takes a whole Secret"
    found = {
        (ref["name"], ref["key"])
        for c in every
        for variable in c.get("env", [])
        if (ref := variable.get("valueFrom", {}).get("secretKeyRef"))
    }
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            items = volume["secret"]["items"]  # a Secret is mounted key by key, never whole
            found |= {(volume["secret"]["secretName"], item["key"]) for item in items}
    return found


def _secret_keys(template: dict[str, Any]) -> set[str]:
    """The keys of the chart's Secrets a pod template can read."""
    return {key for _, key in _secret_refs(template)}


def test_each_component_is_given_only_the_secrets_it_uses() -> None:
    """A runner pod plays the policy's commands; a compromised one must not hold the operator key, the
    providers' keys or the blob store's; the gateway holds no blob store key."""
    templates = {
        o["metadata"]["name"].removeprefix("demo-rollout-"): o["spec"]["template"]
        for o in rendered("k3s")
        if o["kind"] == "Deployment"
    }
    # Each pod's migrate init container logs in as the owner, its service as the worker (the dashboard: the
    # reader, and it migrates nothing).
    ledger = {"databasePassword", "workerPassword"}
    blobs_and_tinker = {"s3AccessKey", "s3SecretKey", "tinkerApiKey"}
    expected = {
        "gateway": ledger | {"gatewaySecret", "operatorKey", "engineKey", "anthropicApiKey", "openaiApiKey"},
        "runner": ledger | {"gatewaySecret", "sandboxKey"},
        "monitor": {"readerPassword"},
    }
    for component, keys in expected.items():
        assert _secret_keys(templates[component]) == keys, component
    engines = ledger | blobs_and_tinker | {"engineKey"}  # an engine signs its serving acks
    ray = {"auth_token"}  # the drivers of what runs on Ray
    if "engine" in templates:
        assert _secret_keys(templates["engine"]) == engines | ray
    if "trainer" in templates:
        assert _secret_keys(templates["trainer"]) == ledger | blobs_and_tinker | ray
    for raycluster in (o for o in rendered("k3s") if o["kind"] == "RayCluster"):
        head = raycluster["spec"]["headGroupSpec"]["template"]  # it migrates nothing
        assert _secret_keys(head) == {"workerPassword"} | blobs_and_tinker
        for group in raycluster["spec"].get("workerGroupSpecs", []):
            assert (
                _secret_keys(group["template"]) == engines
            )  # engines and trainers are placed on its workers


def _reaches(objects: tuple[dict[str, Any], ...]) -> dict[str, set[str]]:
    """Which components each NetworkPolicy lets reach a component (`*`: any of the chart's pods)."""
    allowed: dict[str, set[str]] = {}
    for policy in (
        o for o in objects if o["kind"] == "NetworkPolicy" and "Ingress" in o["spec"]["policyTypes"]
    ):
        target = policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
        allowed[target] = {
            peer["podSelector"]["matchLabels"].get("app.kubernetes.io/component", "*") for peer in peers
        }
    return allowed


def test_each_component_answers_only_the_components_that_use_it() -> None:
    objects = rendered("k3s")
    reaches = _reaches(objects)
    assert reaches["engine"] == {"gateway"}, "only the gateway sends an engine prompts (and its admin routes)"
    assert reaches["runner"] == set() and reaches["trainer"] == set(), "workers answer nobody"
    assert reaches["ray-head"] == {"engine", "trainer", "ray-head", "ray-worker"}, (
        "Ray's Jobs API: drivers only"
    )
    assert "runner" not in reaches["minio"] | reaches["ray-head"] | reaches["ray-worker"], (
        "no checkpoints, no Ray"
    )
    assert reaches["postgres"] == {"*"}
    (egress,) = [
        o for o in objects if o["kind"] == "NetworkPolicy" and o["spec"]["policyTypes"] == ["Egress"]
    ]
    assert egress["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "runner"
    peers = {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for rule in egress["spec"]["egress"]
        for peer in rule.get("to", [])
    }
    assert peers == {"gateway", "postgres", "temporal"}, "runners reach the gateway, the ledger and Temporal"


def test_the_dashboard_listens_on_loopback_unless_it_has_a_login() -> None:
    def monitor(values: dict[str, Any]) -> dict[str, Any]:
        with helm.Chart.load(str(CHART)) as chart:
            manifests = chart.render(values, name="demo", namespace="rollout")
        objects = [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]
        (deployment,) = [
            o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("monitor")
        ]
        return deployment["spec"]["template"]["spec"]["containers"][0]

    plain = monitor({})
    assert plain["args"][plain["args"].index("--host") + 1] == "127.0.0.1"
    assert "ROLLOUT_MONITOR_TOKEN" not in {e["name"] for e in plain["env"]}
    guarded = monitor({"monitor": {"login": True}})
    assert guarded["args"][guarded["args"].index("--host") + 1] == "0.0.0.0"
    (token,) = [e for e in guarded["env"] if e["name"] == "ROLLOUT_MONITOR_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["key"] == "monitorToken"


def test_the_ray_cluster_asks_for_its_token_and_only_its_drivers_hold_it() -> None:
    """Without a token, anything that reaches the Ray head's Jobs API runs code on the GPU workers."""
    objects = rendered("k3s")
    (raycluster,) = [o for o in objects if o["kind"] == "RayCluster"]
    assert raycluster["spec"]["authOptions"]["mode"] == "token"
    holders = {
        o["metadata"]["name"].removeprefix("demo-rollout-")
        for o in objects
        if o["kind"] == "Deployment" and "auth_token" in _secret_keys(o["spec"]["template"])
    }
    assert holders <= {"engine", "trainer"} and holders, holders


ROLES = {"owner": None, "worker": "rollout_worker", "reader": "rollout_reader", "sandbox": "rollout_sandbox"}
PASSWORD_KEYS = {
    "postgres": "postgresPassword",
    "owner": "databasePassword",
    "worker": "workerPassword",
    "reader": "readerPassword",
    "sandbox": "sandboxPassword",
}


def _login_of(component: str, container: dict[str, Any]) -> str | None:
    """The ledger login a container should use: the migration's the owner, the dashboard's the reader, the
    model pull and the other services' containers none, the dev Postgres its superuser, every other rollout
    container the worker."""
    if component == "postgres":
        return "postgres"
    if container["name"] == "models" or not container["image"].split(":")[0].endswith(("/rollout", "-gpu")):
        return None
    if container["name"] == "migrate":
        return "owner"
    return "reader" if component == "monitor" else "worker"


def _password_ref(container: dict[str, Any], variable: str = "PGPASSWORD") -> tuple[str, str] | None:
    for env in container.get("env", []):
        if env["name"] == variable:
            assert "value" not in env, f"{container['name']}: {variable} is written out"
            ref = env["valueFrom"]["secretKeyRef"]
            return ref["name"], ref["key"]
    return None


@pytest.mark.parametrize("name", VALUES)
def test_each_container_logs_in_to_the_ledger_as_its_own_role_with_its_own_secret(name: str) -> None:
    """The owner's URL and password reach only the migrations, the dashboard reads as rollout_reader, every
    other service is rollout_worker; each password is its login's own Secret (or the existing Secret)."""
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
            urls = {"owner": postgres.url, "worker": postgres.worker_url, "reader": postgres.reader_url}
            urls["sandbox"] = postgres.sandbox_url
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
                assert given.keys() == {"worker"}, where
                assert urlsplit(given["worker"]).username == "rollout_worker", where
            assert all(urlsplit(url).password is None for url in given.values()), where
    assert {c.split("/")[1] for c in logins["owner"]} == {"migrate"}
    assert {c.split("/")[0] for c in logins["worker"]} >= {"gateway", "runner", "engine", "trainer"}
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
    objects = tuple(doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc)
    assert not any(o["kind"] == "StatefulSet" for o in objects), "no dev Postgres"
    told: dict[str, set[str]] = {}
    for _, container in containers(objects):
        for argument in map(str, container.get("args", [])):
            if argument.startswith("services.postgres."):
                setting, url = argument.split("=", 1)
                told.setdefault(setting.removeprefix("services.postgres."), set()).add(url.strip("'"))
    assert told["url"] == {owner}
    assert told["worker_url"] == {
        "postgresql://rollout_worker@db.example:6432/ledger?sslmode=require",
        "postgresql://dash@ro.example/ledger",  # the dashboard's, until it reads reader_url
    }
    assert told["reader_url"] == {"postgresql://dash@ro.example/ledger"}


def test_no_pod_but_postgres_sees_the_superuser_password_and_none_is_written_out() -> None:
    """The superuser's Secret is the Postgres pod's alone, the owner's the migrations' (and Postgres's, which
    makes the logins). No Secret's value is in an argument, an environment value or a ConfigMap, and no URL
    given as a setting carries a password."""
    for name in VALUES:
        objects = rendered(name)
        for component, template in pod_templates(objects):
            refs = _secret_refs(template)
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


def test_one_sandbox_key_secret_is_mounted_into_the_runners_only() -> None:
    """Runners prove sandbox claims with the key sandbox hosts check them with: every runner (and any host
    outside the release) must hold the same one, not a key each made in its own emptyDir."""
    objects = rendered("default")
    holders = [name for name, secret in secrets_of(objects).items() if "sandboxKey" in secret]
    assert holders == ["demo-rollout-sandbox-key"]
    assert secrets_of(objects)["demo-rollout-sandbox-key"].keys() == {"sandboxKey"}
    mounted = set()
    for component, template in pod_templates(objects):
        if ("demo-rollout-sandbox-key", "sandboxKey") in _secret_refs(template):
            mounted.add(component)
            volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
            (container,) = template["spec"]["containers"]
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/data/sandbox.key"]
            assert volumes[mount["name"]]["secret"]["secretName"] == "demo-rollout-sandbox-key"
            assert mount["subPath"] == "sandboxKey" and mount["readOnly"]
    assert mounted == {"runner"}, "the trainer, the gateway and the engines have no use for it"


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
    assert passwords.keys() == {f"LEDGER_{login.upper()}_PASSWORD" for login in ROLES}

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
            assert roles == [
                (role, True, False) for role in sorted(["rollout", *filter(None, ROLES.values())])
            ]
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
                "'ledger_append(text, text, bigint, text[], text[], jsonb[])', 'EXECUTE')"
            ).fetchone()
            assert rights == (True, False, True)
        for role, login in (("rollout_reader", "reader"), ("rollout_sandbox", "sandbox")):
            with psycopg.connect(url(role, login)) as connection:  # each logs in with its own password
                assert connection.execute("SELECT current_user").fetchone() == (role,)
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(url("rollout_reader", "worker")).close()
    finally:
        postgres.remove()


@pytest.mark.parametrize("name", VALUES)
def test_the_gateway_and_the_engines_share_the_engine_key_and_no_key_is_an_argument(name: str) -> None:
    """Every engine route asks for the engine API key, which each process derives from the Secret's engineKey
    (rollout.serving.engine_api_key): the Secret mounts it as /data/engine.key into the gateway, the engine
    pods and the Ray workers that run engines, and `rollout engine serve --kind vllm` hands vLLM its key in
    the environment (VLLM_API_KEY). No key is a container's argument (`ps`, `kubectl describe` show those),
    and no secret's variable is a plain value in the manifest."""
    objects = rendered(name)
    holders: set[str] = set()
    for owner, container in containers(objects):
        arguments = " ".join(str(a) for a in container.get("args", []))
        assert "api-key" not in arguments.lower() and "API_KEY" not in arguments, (owner, arguments)
        for variable in container.get("env", []):
            if re.search(r"(_KEY|_TOKEN|_SECRET|PASSWORD)$", variable["name"]):
                assert "value" not in variable, f"{owner}: {variable['name']} in clear in the manifest"
        for mount in container.get("volumeMounts", []):
            if mount["mountPath"] == "/data/engine.key":
                assert mount["subPath"] == "engineKey" and mount.get("readOnly"), (owner, mount)
                holders.add(owner.removeprefix("demo-rollout-"))
    assert {"gateway", "engine"} <= holders, holders
    for raycluster in (o for o in objects if o["kind"] == "RayCluster" and o["spec"].get("workerGroupSpecs")):
        assert raycluster["metadata"]["name"].removeprefix("demo-rollout-") in holders, (
            "its workers run engines"
        )
    assert {"runner", "trainer", "monitor"}.isdisjoint(holders), "only the gateway and engines hold it"
