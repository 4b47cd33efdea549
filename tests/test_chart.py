"""The Helm chart, checked offline: `helm lint`, rendering with each values file, every object validated
strictly against the Kubernetes schemas, the RayCluster against KubeRay's CRD, and every command a container
runs exists in the CLI and takes the settings the chart gives it; each component gets only the secrets and the
network it uses (its ledger logins: tests/test_chart_logins.py).

Helm itself comes from helm-python-sdk (Helm's Go SDK through a C library: no helm binary, no cluster).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.exceptions import TyperException

from rollout.config import Settings, load
from rollout.net import free_port
from rollout.serving.keys import serving_target_key

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
        return objects_of(chart.render(values_of(name), name="demo", namespace="rollout"))


def objects_of(manifests: Mapping[str, str]) -> tuple[dict[str, Any], ...]:
    """The objects of a render's manifests, by file (NOTES.txt, text for people, holds none)."""
    texts = [text for path, text in manifests.items() if not path.endswith("NOTES.txt")]
    return tuple(doc for text in texts for doc in yaml.safe_load_all(text) if doc)


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
    validate_strictly(objects)


def validate_strictly(objects: Iterable[dict[str, Any]]) -> None:
    """Validate each rendered object strictly: a RayCluster against KubeRay's CRD and each of its pod
    templates as a Kubernetes PodTemplateSpec; every other object against the Kubernetes schemas."""
    raycluster_schema = json.loads((ROOT / "tests" / "schemas" / "raycluster-v1.schema.json").read_text())
    for obj in objects:
        if obj["kind"] == "RayCluster":
            jsonschema.validate(obj, raycluster_schema)
            groups = [obj["spec"]["headGroupSpec"], *obj["spec"].get("workerGroupSpecs", [])]
            for group in groups:
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


def parsed(subcommand: tuple[str, ...], args: list[str]) -> dict[str, Any]:
    """The parameters `rollout SUBCOMMAND ARGS...` parses ARGS into, by the CLI's own parser (nothing is run);
    it raises typer's UsageError where the CLI would refuse them."""
    from typer.core import TyperGroup
    from typer.main import get_command

    from rollout.cli.app import app

    command = get_command(app)
    for name in subcommand:
        assert isinstance(command, TyperGroup), f"`rollout {' '.join(subcommand)}`: no {name}"
        command = command.commands[name]
    with command.make_context(" ".join(subcommand), list(args)) as context:
        return dict(context.params)


def check_commands(objects: Iterable[dict[str, Any]]) -> int:
    """Check that every command a rollout container of `objects` runs exists in the CLI, parses, and takes
    the settings the chart gives it; return how many were checked."""
    seen = 0
    for owner, container in containers(tuple(objects)):
        if (
            not container["image"].split(":")[0].endswith(("/rollout", "/rollout-gpu"))
            or "args" not in container
        ):
            continue
        args = [str(a) for a in container["args"]]
        command = [a for a in args if not a.startswith("-") and "=" not in a]
        subcommand = command[: 2 if command[0] in ("worker", "engine", "ledger", "models", "sandbox") else 1]
        helped = help_of(tuple(subcommand))
        assert helped is not None, f"{owner}: `rollout {' '.join(subcommand)}` is not a command"
        for option in (a for a in args if a.startswith("--")):
            assert option in helped, f"{owner}: `rollout {' '.join(subcommand)}` has no {option}"
        assert args[: len(subcommand)] == subcommand, f"{owner}: {args}"
        try:
            parsed(tuple(subcommand), args[len(subcommand) :])
        except TyperException as error:  # a UsageError: an unknown option, a missing or bad value
            raise AssertionError(f"{owner}: `rollout {' '.join(args)}` is refused: {error}") from error
        # The settings compose (secrets arrive as $(VAR), which Kubernetes expands from the environment).
        overrides = [re.sub(r"\$\((\w+)\)", "secret", a) for a in args if "=" in a and not a.startswith("-")]
        settings = load(overrides)
        assert settings.services.temporal.address
        seen += 1
    return seen


@pytest.mark.parametrize("name", VALUES)
def test_every_command_a_container_runs_exists_and_takes_the_charts_settings(name: str) -> None:
    seen = check_commands(rendered(name))
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


def secret_refs(template: dict[str, Any]) -> set[tuple[str, str]]:
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
    return {key for _, key in secret_refs(template)}


def test_each_component_is_given_only_the_secrets_it_uses() -> None:
    """A runner pod plays the policy's commands; a compromised one must not hold the operator key, the
    providers' keys or the blob store's; the gateway holds no blob store key."""
    templates = {
        o["metadata"]["name"].removeprefix("demo-rollout-"): o["spec"]["template"]
        for o in rendered("k3s")
        if o["kind"] == "Deployment"
    }

    # Each pod's migrate init container logs in as the owner, its service as its writer kind (the dashboard:
    # the reader, and it migrates nothing; a role placed on Ray: the worker, as the Ray pods it runs in).
    def ledger(login: str) -> set[str]:
        return {"databasePassword", f"{login}Password"}

    blobs_and_tinker = {"s3AccessKey", "s3SecretKey", "tinkerApiKey"}
    expected = {
        "gateway": ledger("gateway")
        | {"gatewaySecret", "operatorKey", "engineKey", "anthropicApiKey", "openaiApiKey"},
        "runner": ledger("runner") | {"gatewaySecret", "sandboxKey"},
        "monitor": {"readerPassword"},
        "commandhost": {"sandboxPassword", "commandKey"},  # it migrates nothing: no owner's password
    }
    for component, keys in expected.items():
        assert _secret_keys(templates[component]) == keys, component
    engines = ledger("worker") | blobs_and_tinker | {"engineKey"}  # an engine signs its serving acks
    ray = {"auth_token"}  # the drivers of what runs on Ray
    if "engine" in templates:
        assert _secret_keys(templates["engine"]) == engines | ray
    if "trainer" in templates:
        assert _secret_keys(templates["trainer"]) == ledger("worker") | blobs_and_tinker | ray | {
            "servingKey"
        }
    secret = next(o for o in rendered("k3s") if o["kind"] == "Secret" and "engineKey" in o.get("data", {}))
    engine_key, serving_key = (base64.b64decode(secret["data"][k]) for k in ("engineKey", "servingKey"))
    assert serving_key == serving_target_key(engine_key), "the trainer signs targets engines can check"
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
    assert reaches["commandhost"] == {"runner"}, "a command host answers the runners that claim it, only"
    egress = {
        o["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: o["spec"]["egress"]
        for o in objects
        if o["kind"] == "NetworkPolicy" and o["spec"]["policyTypes"] == ["Egress"]
    }
    components = {
        o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    }
    assert components <= set(egress), f"every component's egress is bounded: {components - set(egress)}"

    def peers(component: str) -> set[str]:
        return {
            peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for rule in egress[component]
            for peer in rule.get("to", [])
            if "app.kubernetes.io/component" in peer.get("podSelector", {}).get("matchLabels", {})
        }

    def internet(component: str) -> bool:
        return any("ipBlock" in peer for rule in egress[component] for peer in rule.get("to", []))

    assert peers("runner") == {"gateway", "postgres", "temporal", "commandhost"}
    assert peers("commandhost") == {"gateway", "postgres"}, (
        "a command host reaches its seats' gateway, its ledger"
    )
    assert not internet("runner") and not internet("commandhost"), "where the policy plays: no internet"
    assert not internet("postgres") and not internet("monitor")
    for component, rules in egress.items():  # port 53 leads to the cluster's DNS only, never anywhere
        (dns,) = [r for r in rules if any(p.get("port") == 53 for p in r.get("ports", []))]
        assert [p["podSelector"]["matchLabels"] for p in dns["to"]] == [{"k8s-app": "kube-dns"}], component
    assert internet("gateway"), "the gateway calls the providers' APIs"
    for rule in (r for c in egress for r in egress[c] for peer in r.get("to", []) if "ipBlock" in peer):
        assert "10.0.0.0/8" in rule["to"][0]["ipBlock"]["except"], "the internet, never the cluster's own"


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


@pytest.mark.parametrize("name", VALUES)
def test_the_gateway_and_the_engines_share_the_engine_key_and_no_key_is_an_argument(name: str) -> None:
    """Every engine route asks for the engine API key, which each process derives from the Secret's engineKey
    (rollout.serving.keys.engine_api_key): the Secret mounts it as /data/engine.key into the gateway, the
    engine pods and the Ray workers that run engines, and `rollout engine serve --kind vllm` hands vLLM its
    key in the environment (VLLM_API_KEY). No key is a container's argument (`ps`, `kubectl describe` show
    those), and no secret's variable is a plain value in the manifest."""
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


def test_command_seats_run_on_command_hosts_of_their_own() -> None:
    """Runners claim command hosts (sandbox.command_pool=command): pods that serve the `command` kind, with no
    service-account token; turned off, the runners play command seats in their own jails."""

    def deployments(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
        with helm.Chart.load(str(CHART)) as chart:
            manifests = chart.render(values, name="demo", namespace="rollout")
        objects = [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]
        return {
            o["metadata"]["name"].removeprefix("demo-rollout-"): o["spec"]["template"]["spec"]
            for o in objects
            if o["kind"] == "Deployment"
        }

    on = deployments({})
    runner_args = [str(a) for a in on["runner"]["containers"][0]["args"]]
    assert load([a for a in runner_args if "=" in a]).sandbox.command_pool == "command"
    host = on["commandhost"]
    assert host["automountServiceAccountToken"] is False and host["enableServiceLinks"] is False
    assert "initContainers" not in host, "no migration: the owner's password stays out of this pod"
    args = [str(a) for a in host["containers"][0]["args"]]
    assert args[:4] == ["sandbox", "serve", "--kind", "command"]
    assert args[args.index("--host") + 1] == "$(POD_IP)", "it registers the address runners reach it at"

    off = deployments({"commandHosts": {"enabled": False}})
    assert "commandhost" not in off
    runner_args = [str(a) for a in off["runner"]["containers"][0]["args"]]
    assert load([a for a in runner_args if "=" in a]).sandbox.command_pool == ""


def test_only_the_pods_that_jail_commands_get_the_jails_pod_security() -> None:
    """Runners and command hosts run bubblewrap: their pods get a user namespace of their own, an unmasked
    /proc and profiles that allow namespaces (values' `jail`), over the chart's securityContext (no
    capability, no privilege escalation). No other pod gets any of it, and none is privileged."""
    jailing = {"runner", "commandhost"}
    seen: set[str] = set()
    for component, template in pod_templates(rendered("default")):
        spec = template["spec"]
        for container in spec["containers"]:
            context = container.get("securityContext", {})
            assert not context.get("privileged"), f"{component} is privileged"
            if component in jailing:
                seen.add(component)
                assert spec["hostUsers"] is False
                assert context["procMount"] == "Unmasked"
                assert context["seccompProfile"] == {"type": "Unconfined"}
                assert context["appArmorProfile"] == {"type": "Unconfined"}
                assert context["capabilities"] == {"drop": ["ALL"]}
                assert context["allowPrivilegeEscalation"] is False
            else:
                assert "hostUsers" not in spec and "procMount" not in context, component
                assert context.get("seccompProfile", {}).get("type") != "Unconfined", component
    assert seen == jailing

    with helm.Chart.load(str(CHART)) as chart:
        gvisor = objects_of(
            chart.render(
                {"jail": {"runtimeClassName": "gvisor", "seccompProfile": {"type": "RuntimeDefault"}}},
                name="demo",
                namespace="rollout",
            )
        )
    classes = {component: t["spec"].get("runtimeClassName") for component, t in pod_templates(gvisor)}
    assert classes["runner"] == classes["commandhost"] == "gvisor" and classes["gateway"] is None
    runner = next(t for component, t in pod_templates(gvisor) if component == "runner")
    assert runner["spec"]["containers"][0]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_temporal_tls_secret_reaches_only_the_pods_that_use_temporal() -> None:
    """`services.temporal.tlsSecret`: the client certificate for a Temporal with mutual TLS is mounted into
    the runner, trainer, gateway and monitor pods (the ones that reach Temporal), whose settings point at it;
    no other pod (the command hosts, which run the policy's commands, least of all) gets the Secret."""
    values = {"services": {"temporal": {"address": "temporal.example:7233", "tlsSecret": "temporal-client"}}}
    with helm.Chart.load(str(CHART)) as chart:
        objects = objects_of(chart.render(values, name="demo", namespace="rollout"))
    mounted = set()
    for component, template in pod_templates(objects):
        secrets = {v["secret"]["secretName"] for v in template["spec"].get("volumes", []) if "secret" in v}
        if "temporal-client" in secrets:
            mounted.add(component)
            args = [str(a) for a in template["spec"]["containers"][0]["args"]]
            settings = load([a for a in args if "=" in a and not a.startswith("-")])
            temporal = settings.services.temporal
            assert temporal.tls_cert == "/etc/rollout/temporal-tls/tls.crt" and temporal.tls_key, component
            assert temporal.tls_ca == "/etc/rollout/temporal-tls/ca.crt", component
    assert mounted == {"runner", "trainer", "gateway", "monitor"}, mounted
