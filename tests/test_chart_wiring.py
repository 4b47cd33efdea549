"""The chart's wiring, run for real without Kubernetes: render the chart, start each of its rollout containers
(the migration Job, gateway, engine, runner, trainer) as a local process with the command, arguments and
environment Kubernetes would give it (Secret values resolved, `$(VAR)` expanded, each pod's /data its own folder
with the Secret's files mounted in it, Service names resolved to this machine), against a local Postgres, Temporal
and an S3 server standing in for the cluster's. Then `rollout cluster connect`, `rollout preset load … --cluster`
and a 2-step `rollout train … --preset NAME --cluster` with the preset read from the cluster's ledger, and a seat
opened through the gateway's operator route with the Secret's operator key."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import pytest
import yaml
from moto.server import ThreadedMotoServer

from rollout.config import Settings
from rollout.net import free_port
from rollout.stack.embedded import Stack
from rollout.stack.processes import terminate
from tests.stackutil import isolated_settings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "rollout"
ROLLOUT = str(Path(sys.executable).parent / "rollout")
RELEASE = "wiring"
ROLES = ("gateway", "engine", "runner", "trainer")  # the Deployments started, after the migration Job
MICRO_PRESET = (ROOT / "rollout" / "conf" / "preset" / "cpu-micro.yaml").read_text()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[Settings, str]]:
    """Postgres and Temporal (an embedded stack with nothing else) and moto's S3 server: the cluster's services."""
    settings = isolated_settings(tmp_path / "services")
    stack = Stack(settings)
    port = free_port()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    try:
        stack.up()
        s3.start()
        yield settings, f"127.0.0.1:{port}"
    finally:
        s3.stop()
        stack.down()


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name=RELEASE, namespace="rollout")
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


class Pod:
    """One rendered container, run here as Kubernetes would run it."""

    def __init__(self, name: str, spec: dict[str, Any], secret: dict[str, str], root: Path) -> None:
        self.name, self.root = name, root / name
        container = spec["containers"][0]
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        self.data = self.root / "data"
        self.data.mkdir(parents=True)
        for mount in container.get("volumeMounts", []):  # /data, with the Secret's files in it
            volume = volumes[mount["name"]]
            target = self.local(mount["mountPath"])
            if "secret" in volume:
                target.write_text(secret[mount["subPath"]])
                target.chmod(0o440)
        self.env: dict[str, str] = {}
        for variable in container.get("env", []):
            value = variable.get("value")
            if value is None:
                value = secret.get(variable["valueFrom"]["secretKeyRef"]["key"], "")
            self.env[variable["name"]] = str(self.local(value)) if value == "/data" else str(value)
        self.args = [self.resolve(argument) for argument in container["args"]]
        self.ports = [port["containerPort"] for port in container.get("ports", [])]
        self.probe = container.get("readinessProbe", {}).get("httpGet", {}).get("path")
        self.process: subprocess.Popen[bytes] | None = None

    def local(self, path: str) -> Path:
        return self.data / Path(path).relative_to("/data") if path.startswith("/data") else Path(path)

    def resolve(self, argument: str) -> str:
        argument = re.sub(r"\$\((\w+)\)", lambda match: self.env.get(match.group(1), ""), argument)
        argument = argument.replace("data_dir=/data", f"data_dir={self.data}")
        return re.sub(
            rf"//{RELEASE}-rollout-[a-z-]+:", "//127.0.0.1:", argument
        )  # Service names: this machine

    def start(self) -> None:
        log = (self.root / "log").open("ab")
        self.process = subprocess.Popen(
            [ROLLOUT, *self.args],  # the image's entrypoint is `rollout`
            cwd=self.root,
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def tail(self) -> str:
        path = self.root / "log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            terminate(self.process.pid)


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            found[component] = obj["spec"]["template"]["spec"]
    return found


def secret_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    (secret,) = [obj for obj in objects if obj["kind"] == "Secret"]
    return {key: base64.b64decode(value or "").decode() for key, value in secret["data"].items()}


@pytest.mark.timeout(900)
def test_the_charts_containers_run_as_processes_and_a_cluster_run_trains(
    services: tuple[Settings, str], tmp_path: Path, models_dir: Path, tiny_qwen3: str
) -> None:
    settings, s3_endpoint = services
    gateway_port, engine_port = free_port(), free_port()
    objects = render(
        {
            "model": "tiny-qwen3",
            "maxContext": 2048,
            "services": {
                "postgres": {"url": settings.ledger_url, "dev": False},
                "temporal": {"address": settings.temporal_address, "dev": False},
                "blobs": {"url": "s3://wiring/", "s3_endpoint": s3_endpoint, "s3_secure": False},
                "minio": {"dev": False},
            },
            "secrets": {"s3AccessKey": "wiring", "s3SecretKey": "wiring-secret"},
            "gateway": {"port": gateway_port},
            "runner": {"replicas": 1, "maxActivities": 8},
            "monitor": {"enabled": False},
            "ray": {"enabled": False},
            "engine": {"kind": "local", "placement": "pod", "gpus": 0, "device": "cpu", "port": engine_port},
            "trainer": {"placement": "pod", "device": "cpu", "gpus": 0, "preset": "cpu-micro"},
            "extraSettings": [f"models_dir={models_dir}"],
        }
    )
    specs = pod_specs(objects)
    assert {"migrate", *ROLES} <= specs.keys(), specs.keys()
    secret = secret_of(objects)
    pods = {name: Pod(name, specs[name], secret, tmp_path / "pods") for name in ("migrate", *ROLES)}
    try:
        migrate = pods["migrate"]
        migrate.start()
        assert migrate.process is not None and migrate.process.wait(timeout=120) == 0, migrate.tail()
        for name in ROLES:
            pods[name].start()
        for name in ROLES:
            wait_ready(pods[name])

        home = tmp_path / "config"
        env = {**os.environ, "ROLLOUT_CONFIG_HOME": str(home), **pods["trainer"].env}
        env.pop("ROLLOUT_DATA_DIR")  # the CLI runs on a laptop, not in a pod
        key_file = tmp_path / "operator.key"
        key_file.write_text(secret["operatorKey"])
        connect = [
            *("cluster", "connect", "wiring", "--postgres-url", settings.ledger_url),
            *("--temporal", settings.temporal_address, "--blobs-url", "s3://wiring/"),
            *(
                "--s3-endpoint",
                s3_endpoint,
                "--no-s3-secure",
                "--gateway-url",
                f"http://127.0.0.1:{gateway_port}",
            ),
            *("--operator-key-file", str(key_file)),
        ]
        cli(connect, env, tmp_path)

        loaded = json.loads(
            cli(["preset", "load", str(CHART / "files" / "presets"), "--cluster", "--json"], env, tmp_path)
        )
        assert [p["preset"] for p in loaded] == ["minecraft-one-gpu@1"]
        ours = tmp_path / "presets"
        ours.mkdir()
        (ours / "wiring-micro.yaml").write_text(MICRO_PRESET.replace("steps: 5", "steps: 2"))
        cli(["preset", "load", str(ours), "--cluster"], env, tmp_path)
        listed = json.loads(cli(["preset", "list", "--cluster", "--json"], env, tmp_path))
        assert {p["preset"] for p in listed} == {"minecraft-one-gpu@1", "wiring-micro@1"}

        # trainer.steps comes from the stored preset: the built-in cpu-micro trains 5.
        trained = cli(
            [
                "train",
                "arithmetic.environment:environment",
                "--preset",
                "wiring-micro",
                "--cluster",
                "--json",
            ],
            env,
            tmp_path,
            timeout=600,
        )
        summary = json.loads(trained.strip().splitlines()[-1])
        assert summary["steps"] == 2 and set(summary["served"]) == set(summary["checkpoints"]), summary
        runs = json.loads(cli(["run", "list", "--cluster", "--json"], env, tmp_path))
        assert [r["steps"] for r in runs if r["run"] == summary["run"]] == [2]

        seat = json.loads(cli(["seat", "new", "--cluster", "--json"], env, tmp_path))
        assert seat["base_url"].startswith(f"http://127.0.0.1:{gateway_port}/s/")
        reply = httpx.post(
            f"{seat['base_url']}/chat/completions",
            json={"model": "base", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
    finally:
        for pod in pods.values():
            pod.stop()
    shutil.rmtree(tmp_path / "pods", ignore_errors=True)


def wait_ready(pod: Pod, timeout_s: float = 300) -> None:
    """Ready as Kubernetes would see it: its readiness probe answers (a pod without one: it keeps running)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert pod.process is not None and pod.process.poll() is None, f"{pod.name} exited:\n{pod.tail()}"
        if not pod.probe:
            return
        try:
            if httpx.get(f"http://127.0.0.1:{pod.ports[0]}{pod.probe}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{pod.name} did not become ready:\n{pod.tail()}"
        time.sleep(0.5)


def cli(arguments: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> str:
    done = subprocess.run(
        [ROLLOUT, *arguments], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (
        f"rollout {' '.join(arguments)}:\n{done.stderr[-3000:]}\n{done.stdout[-2000:]}"
    )
    return done.stdout
