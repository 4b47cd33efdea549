"""The chart's base model per policy (`policyModels`): each entry's model gets an engine Deployment of its
own, like the engine section's but serving that model with the entry's engine settings (a Ray worker group of
its own, or the shared one), selecting only its own pods; the gateway, the trainer and the entry's engines
(their pods, or their Ray group's workers) pull its model; without entries the chart renders as before. An
entry's `trainer` key gets its model's policies a trainer Deployment of their own, on the task queue
rollout-trainer-SLUG; without it nothing more renders."""

from __future__ import annotations

import copy
import json
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.test_chart import CHART, check_commands, help_of, objects_of, rendered, validate_strictly

DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
ENGINE = "demo-rollout-engine"
POLICY_ENGINE = "demo-rollout-engine-qwen3-0-6b"
TRAINER = "demo-rollout-trainer"
POLICY_TRAINER = "demo-rollout-trainer-qwen3-0-6b"
QUEUE = "rollout-trainer-qwen3-0-6b"  # what a run names in policies.NAME.trainer_queue


def with_group(*names: str) -> dict[str, Any]:
    """The default Ray worker groups and more, `names`, each like the default engines group."""
    groups = DEFAULTS["ray"]["workerGroups"]
    (engines,) = [g for g in groups if g["name"] == "engines"]
    return {"ray": {"workerGroups": [*groups, *({**copy.deepcopy(engines), "name": n} for n in names)]}}


ON_RAY = {
    **with_group("engines-b"),
    "policyModels": [{"model": "qwen3-0.6b", "engine": {"rayGroup": "engines-b"}}],
}
# A CPU cluster: every role in its own pod, the policy's engine with the engine section's settings.
IN_PODS = {
    "ray": {"enabled": False},
    "engine": {"kind": "local", "placement": "pod", "gpus": 0, "device": "cpu"},
    "trainer": {"placement": "pod", "device": "cpu"},
    "policyModels": [{"model": "qwen3-0.6b"}],
}
# The policy's model gets a trainer of its own: on a Ray worker group of its own, or in a pod of its own.
ON_RAY_TRAINER = {
    **with_group("engines-b", "trainer-b"),
    "policyModels": [
        {"model": "qwen3-0.6b", "engine": {"rayGroup": "engines-b"}, "trainer": {"rayGroup": "trainer-b"}}
    ],
}
# The same without the trainer key: the render ON_RAY_TRAINER adds to.
ON_RAY_SHARED = {**ON_RAY, **with_group("engines-b", "trainer-b")}
OWN_RESOURCES = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
IN_PODS_TRAINER = {
    **IN_PODS,
    "policyModels": [
        {"model": "qwen3-0.6b", "trainer": {"placement": "pod", "device": "cpu", "resources": OWN_RESOURCES}}
    ],
}


def manifests_of(values: dict[str, Any]) -> dict[str, str]:
    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(values, name="demo", namespace="rollout")


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The rendered objects (NOTES.txt, text for people, is none)."""
    return list(objects_of(manifests_of(values)))


def by_name(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pulled(template: dict[str, Any]) -> list[str]:
    """The models a pod template's init containers pull."""
    return [
        str(c["args"][2])
        for c in template["spec"].get("initContainers", [])
        if [str(a) for a in c["args"][:2]] == ["models", "pull"]
    ]


def worker_groups(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (raycluster,) = [o for o in objects if o["kind"] == "RayCluster"]
    return {g["groupName"]: g["template"] for g in raycluster["spec"]["workerGroupSpecs"]}


def argument(container: dict[str, Any], option: str) -> str:
    args = [str(a) for a in container["args"]]
    return args[args.index(option) + 1]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def without_secrets(objects: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """The objects but the Secrets, whose generated values differ from render to render."""
    return [o for o in objects if o["kind"] != "Secret"]


def test_a_policy_model_gets_an_engine_deployment_of_its_own_on_its_ray_group() -> None:
    objects = render(ON_RAY)
    deployments = by_name(objects, "Deployment")
    main, policy = deployments[ENGINE], deployments[POLICY_ENGINE]
    (engine,) = policy["spec"]["template"]["spec"]["containers"]
    assert argument(engine, "--model") == "qwen3-0.6b"
    assert argument(engine, "--ray-group") == "engines-b", "the entry's own worker group"
    assert argument(main["spec"]["template"]["spec"]["containers"][0], "--ray-group") == "engines"
    # Engines sharing a Ray worker never bind one port: the entry's is the engine port + 1.
    assert argument(engine, "--port") == str(DEFAULTS["engine"]["port"] + 1)
    # Everything else is the engine section's: the same command but for its model, port and group.
    main_args = [str(a) for a in main["spec"]["template"]["spec"]["containers"][0]["args"]]
    policy_args = [str(a) for a in engine["args"]]
    assert len(main_args) == len(policy_args)
    assert {(a, b) for a, b in zip(main_args, policy_args, strict=True) if a != b} == {
        ("smollm2", "qwen3-0.6b"),
        (str(DEFAULTS["engine"]["port"]), str(DEFAULTS["engine"]["port"] + 1)),
        ("engines", "engines-b"),
    }
    assert help_of(("engine", "serve")) is not None
    assert {"--model", "--port", "--ray-group"} <= {a for a in policy_args if a.startswith("--")}


def test_each_engine_deployment_selects_only_its_own_pods_which_the_network_policies_cover() -> None:
    for values in (ON_RAY, IN_PODS):
        objects = render(values)
        deployments = by_name(objects, "Deployment")
        pod_labels = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments.items()}
        selectors = {name: d["spec"]["selector"]["matchLabels"] for name, d in deployments.items()}
        assert len({json.dumps(s, sort_keys=True) for s in selectors.values()}) == len(selectors)
        assert pod_labels[POLICY_ENGINE]["app.kubernetes.io/component"] == "engine"
        assert [n for n in pod_labels if matches(selectors[POLICY_ENGINE], pod_labels[n])] == [POLICY_ENGINE]
        # The main engine's selector is as it was (Kubernetes cannot change a Deployment's on upgrade); it
        # matches only the engines' pods.
        assert (
            selectors[ENGINE]
            == by_name(list(rendered("default")), "Deployment")[ENGINE]["spec"]["selector"]["matchLabels"]
        )
        assert {n for n in pod_labels if matches(selectors[ENGINE], pod_labels[n])} == {ENGINE, POLICY_ENGINE}
        # The NetworkPolicies of the engines (the gateway's prompts in, the engine's way out) cover its pods.
        policies = [
            o["spec"]["podSelector"]["matchLabels"]
            for o in objects
            if o["kind"] == "NetworkPolicy"
            and o["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "engine"
        ]
        assert len(policies) == 2 and all(matches(p, pod_labels[POLICY_ENGINE]) for p in policies)
    # In pods, the engine Service (the gateway's --engine-url, its own model's) reaches the main engine's
    # pods only; the policy's engine is reached at the address it acks.
    objects = render(IN_PODS)
    pod_labels = {
        n: d["spec"]["template"]["metadata"]["labels"] for n, d in by_name(objects, "Deployment").items()
    }
    service = by_name(objects, "Service")[ENGINE]["spec"]["selector"]
    assert [n for n in pod_labels if matches(service, pod_labels[n])] == [ENGINE]
    assert POLICY_ENGINE not in by_name(objects, "Service")


def test_the_gateway_the_trainer_and_the_policys_engines_pull_its_model() -> None:
    on_ray = render(ON_RAY)
    deployments = by_name(on_ray, "Deployment")
    assert pulled(deployments["demo-rollout-gateway"]["spec"]["template"]) == ["smollm2", "qwen3-0.6b"]
    # On Ray, the drivers load no model; the workers Ray places the roles on pull theirs: the trainer's group
    # every policy's (it trains every policy), the entry's group its model, the engine section's group not it.
    assert pulled(deployments[POLICY_ENGINE]["spec"]["template"]) == []
    groups = worker_groups(on_ray)
    assert pulled(groups["trainer"]) == ["smollm2", "qwen3-0.6b"]
    assert pulled(groups["engines-b"]) == ["smollm2", "qwen3-0.6b"]
    assert pulled(groups["engines"]) == ["smollm2"]
    in_pods = by_name(render(IN_PODS), "Deployment")
    assert pulled(in_pods["demo-rollout-gateway"]["spec"]["template"]) == ["smollm2", "qwen3-0.6b"]
    assert pulled(in_pods["demo-rollout-trainer"]["spec"]["template"]) == ["smollm2", "qwen3-0.6b"]
    assert pulled(in_pods[ENGINE]["spec"]["template"]) == ["smollm2"]
    assert pulled(in_pods[POLICY_ENGINE]["spec"]["template"]) == ["qwen3-0.6b"]
    names = [c["name"] for c in in_pods["demo-rollout-gateway"]["spec"]["template"]["spec"]["initContainers"]]
    assert names == ["migrate", "models", "models-qwen3-0-6b"]


@pytest.mark.parametrize(
    "values",
    [ON_RAY, IN_PODS, ON_RAY_TRAINER, IN_PODS_TRAINER],
    ids=["on-ray", "in-pods", "on-ray-with-trainer", "in-pods-with-trainer"],
)
def test_the_render_with_policy_models_is_valid_kubernetes_and_passes_helm_lint(
    values: dict[str, Any],
) -> None:
    report = helm.lint(str(CHART), values=values)
    assert not report["errors"], report
    assert all(m["severity"] <= 1 for m in report["messages"]), report["messages"]
    objects = render(values)
    validate_strictly(objects)
    # Every command its containers run exists in the CLI, parses and takes its settings; the policy trainer's
    # too: its migration, its model's pull (in a pod) and `worker trainer --task-queue ...`.
    assert check_commands(objects) >= 8
    if trainer := by_name(objects, "Deployment").get(POLICY_TRAINER):
        assert check_commands([trainer]) == (2 if values is ON_RAY_TRAINER else 3)


def test_without_policy_models_the_render_is_unchanged() -> None:
    default = without_secrets(rendered("default"))
    assert without_secrets(render({"policyModels": []})) == default
    # With one, the main engine's Deployment differs only in its pods' model label (its Service selects by
    # it); the objects that differ are those that pull the model or run its engine.
    objects = without_secrets(render(ON_RAY))
    before = {(o["kind"], o["metadata"]["name"]): o for o in render(with_group("engines-b"))}
    after = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert after.keys() - before.keys() == {("Deployment", POLICY_ENGINE)}
    changed = {
        key for key in before.keys() & after.keys() if before[key] != after[key] and key[0] != "Secret"
    }
    assert changed == {
        ("Deployment", ENGINE),
        ("Deployment", "demo-rollout-gateway"),
        ("RayCluster", "demo-rollout-ray"),
    }
    main = copy.deepcopy(after[("Deployment", ENGINE)])
    assert main["spec"]["template"]["metadata"]["labels"].pop("rollout.dev/model") == "smollm2"
    assert main == before[("Deployment", ENGINE)]


def test_a_policy_model_is_refused_when_it_is_the_charts_own_or_given_twice_or_misspelt() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        with pytest.raises(helm.HelmError, match="chart's model"):
            chart.render({"policyModels": [{"model": "smollm2"}]}, name="demo", namespace="rollout")
        twice = {"policyModels": [{"model": "qwen3-0.6b"}, {"model": "Qwen3 0.6B"}]}
        with pytest.raises(helm.HelmError, match="one entry per model"):
            chart.render(twice, name="demo", namespace="rollout")
        no_group = {"policyModels": [{"model": "qwen3-0.6b", "engine": {"rayGroup": ""}}]}
        with pytest.raises(helm.HelmError, match=r"policyModels\[0\]\.engine\.rayGroup"):
            chart.render(no_group, name="demo", namespace="rollout")
        chart.validate_schema(ON_RAY)
        with pytest.raises(helm.HelmError, match="rayGrup"):
            chart.validate_schema({"policyModels": [{"model": "qwen3-0.6b", "engine": {"rayGrup": "b"}}]})
        with pytest.raises(helm.HelmError):
            chart.validate_schema({"policyModels": [{"engine": {"rayGroup": "b"}}]})


def test_a_policy_models_trainer_key_gets_a_trainer_deployment_of_its_own_on_its_ray_group() -> None:
    objects = render(ON_RAY_TRAINER)
    deployments = by_name(objects, "Deployment")
    main, policy = deployments[TRAINER], deployments[POLICY_TRAINER]
    (trainer,) = policy["spec"]["template"]["spec"]["containers"]
    args = [str(a) for a in trainer["args"]]
    assert args[:4] == ["worker", "trainer", "--task-queue", QUEUE]
    assert "trainer.model=qwen3-0.6b" in args
    assert argument(trainer, "--ray-group") == "trainer-b", "the entry's own worker group"
    # Everything else is the trainer section's: the main trainer's command but for its queue, model and group.
    main_args = [str(a) for a in main["spec"]["template"]["spec"]["containers"][0]["args"]]
    assert "--task-queue" not in main_args, "the main trainer polls the trainer queue"
    assert {(a, b) for a, b in zip(main_args, args[:2] + args[4:], strict=True) if a != b} == {
        ("trainer.model=smollm2", "trainer.model=qwen3-0.6b"),
        ("trainer", "trainer-b"),
    }
    # The new Deployment selects only its own pods, which keep the component `trainer` (the trainers'
    # NetworkPolicies cover them); the main trainer is as it was, in the default render too.
    pod_labels = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments.items()}
    selector = policy["spec"]["selector"]["matchLabels"]
    assert [n for n in pod_labels if matches(selector, pod_labels[n])] == [POLICY_TRAINER]
    assert pod_labels[POLICY_TRAINER]["app.kubernetes.io/component"] == "trainer"
    shared = render(ON_RAY_SHARED)
    assert (
        main
        == by_name(shared, "Deployment")[TRAINER]
        == by_name(list(rendered("default")), "Deployment")[TRAINER]
    )
    # Only the trainer Deployment is new, and only the RayCluster changes: the entry's trainer group pulls its
    # model (the trainer section's group still pulls every policy's, for the runs that train there).
    after = {(o["kind"], o["metadata"]["name"]): o for o in without_secrets(objects)}
    before = {(o["kind"], o["metadata"]["name"]): o for o in without_secrets(shared)}
    assert after.keys() - before.keys() == {("Deployment", POLICY_TRAINER)} and before.keys() <= after.keys()
    assert {key for key in before if before[key] != after[key]} == {("RayCluster", "demo-rollout-ray")}
    assert pulled(worker_groups(shared)["trainer-b"]) == ["smollm2"]
    assert pulled(worker_groups(objects)["trainer-b"]) == ["smollm2", "qwen3-0.6b"]
    assert pulled(worker_groups(objects)["trainer"]) == ["smollm2", "qwen3-0.6b"]


def test_a_policy_models_trainer_in_a_pod_of_its_own_trains_its_model_with_its_own_settings() -> None:
    deployments = by_name(render(IN_PODS_TRAINER), "Deployment")
    template = deployments[POLICY_TRAINER]["spec"]["template"]
    (trainer,) = template["spec"]["containers"]
    args = [str(a) for a in trainer["args"]]
    assert argument(trainer, "--task-queue") == QUEUE and "--placement" not in args
    assert {"trainer.model=qwen3-0.6b", "trainer.device=cpu"} <= set(args)
    assert trainer["image"].split(":")[0] == DEFAULTS["image"]["repository"], "the CPU image"
    assert trainer["resources"] == OWN_RESOURCES, "the entry's, whole, and no GPU"
    assert pulled(template) == ["qwen3-0.6b"], "its own model only"
    # The main trainer is as it was: it trains every policy's model.
    main = deployments[TRAINER]
    assert pulled(main["spec"]["template"]) == ["smollm2", "qwen3-0.6b"]
    assert main == by_name(render(IN_PODS), "Deployment")[TRAINER]


def test_the_notes_name_each_policy_trainers_task_queue() -> None:
    notes = manifests_of(ON_RAY_TRAINER)["rollout/templates/NOTES.txt"]
    assert f"qwen3-0.6b: policies.NAME.trainer_queue={QUEUE}" in notes
    assert not manifests_of(ON_RAY).get("rollout/templates/NOTES.txt", "").strip(), "no trainer key, no notes"


def test_a_policy_models_trainer_is_refused_when_misspelt_or_misplaced() -> None:
    def entry(trainer: Any) -> dict[str, Any]:
        return {"policyModels": [{"model": "qwen3-0.6b", "trainer": trainer}]}

    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(ON_RAY_TRAINER)
        chart.validate_schema(entry({}))
        with pytest.raises(helm.HelmError, match="trainer/placement"):
            chart.validate_schema(entry({"placement": "nowhere"}))
        with pytest.raises(helm.HelmError, match="rayGrup"):
            chart.validate_schema(entry({"rayGrup": "trainer-b"}))
        with pytest.raises(helm.HelmError, match="gpuMode"):  # gpu.mode is every process's setting
            chart.validate_schema(entry({"gpuMode": "shared"}))
        with pytest.raises(helm.HelmError):
            chart.validate_schema(entry("trainer-b"))
        with pytest.raises(helm.HelmError, match=r"policyModels\[0\]\.trainer\.gpus must be a whole number"):
            chart.render(entry({"placement": "pod", "gpus": 0.5}), name="demo", namespace="rollout")
