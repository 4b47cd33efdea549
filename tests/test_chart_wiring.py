"""The chart's wiring, run for real without Kubernetes: render the chart, start each of its rollout pods
(gateway, engine, runner, trainer: each pod's init containers first, the ledger migration and the model pull)
as local processes with the command, arguments and environment Kubernetes would give them (Secret values
resolved, `$(VAR)` expanded, each pod's /data its own folder with the Secret's files in it, ConfigMaps
mounted, Service names resolved to this machine), against a local Postgres, Temporal and an S3 server standing
in for the cluster's. The ledger is a database of that Postgres, made as the chart's dev Postgres makes its
own: its init script, run by the superuser with the rendered Secrets' passwords, makes the owner (no
superuser) and the roles, so each pod migrates as the owner and serves as its writer kind's login (the gateway
as rollout_gateway, the engine's follower as rollout_serving, ...). Then `rollout
cluster connect` (as the owner), `rollout preset load … --cluster` and a 2-step `rollout train … --preset NAME
--cluster` with the preset read from the cluster's ledger, and a seat opened through the gateway's operator
route with the Secret's operator key; the engine, which the gateway reaches with the API key derived from the
Secret's engineKey, refuses whoever lacks it."""

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import httpx
import psycopg
import pytest
from moto.server import ThreadedMotoServer
from psycopg import sql

from rollout.config import Settings
from rollout.net import free_port
from rollout.serving.keys import engine_api_key
from rollout.stack.embedded import Stack
from rollout.stack.postgres import binaries_dir
from rollout.stack.processes import terminate
from rollout_testing.stacks import isolated_settings
from tests.test_chart import objects_of
from tests.test_chart_logins import SERVICE_LOGINS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "rollout"
ROLLOUT = str(Path(sys.executable).parent / "rollout")
RELEASE = "wiring"
ROLES = ("gateway", "engine", "runner", "trainer")  # the Deployments started (each migrates first)
MICRO_PRESET = (ROOT / "rollout" / "conf" / "preset" / "cpu-micro.yaml").read_text()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[Settings, str]]:
    """Postgres and Temporal (an embedded stack with nothing else) and moto's S3 server: the cluster's
    services."""
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
        return list(objects_of(chart.render(values, name=RELEASE, namespace="rollout")))


class Pod:
    """One rendered pod, run here as Kubernetes would run it: its init containers one after another, each to
    its end, then its container."""

    def __init__(
        self,
        name: str,
        spec: dict[str, Any],
        secrets: dict[str, dict[str, str]],
        config_maps: dict[str, dict[str, str]],
        root: Path,
    ) -> None:
        self.name, self.root, self.secrets = name, root / name, secrets
        self.spec = spec
        self.data = self.root / "data"
        self.data.mkdir(parents=True)
        self.mounts = {"/data": self.data}  # a path in the pod -> where it is here
        container = spec["containers"][0]
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for mount in container.get("volumeMounts", []):  # /data, the Secret's files in it, ConfigMaps
            volume = volumes[mount["name"]]
            if "secret" in volume:
                key = {item["path"]: item["key"] for item in volume["secret"]["items"]}[mount["subPath"]]
                target = self.data / Path(mount["mountPath"]).relative_to("/data")
                target.write_text(secrets[volume["secret"]["secretName"]][key])
                target.chmod(0o440)
            elif "configMap" in volume:
                folder = self.root / "mounts" / mount["mountPath"].lstrip("/")
                folder.mkdir(parents=True)
                for file, text in config_maps[volume["configMap"]["name"]].items():
                    (folder / file).write_text(text)
                self.mounts[mount["mountPath"]] = folder
        self.env = self.env_of(container)
        self.ports = [port["containerPort"] for port in container.get("ports", [])]
        self.probe = container.get("readinessProbe", {}).get("httpGet", {}).get("path")
        self.process: subprocess.Popen[bytes] | None = None

    def env_of(self, container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for variable in container.get("env", []):
            value = variable.get("value")
            source = variable.get("valueFrom", {})
            if "secretKeyRef" in source:  # a Secret the chart made, with that key (unless optional)
                ref = source["secretKeyRef"]
                secret = self.secrets[ref["name"]]
                value = secret.get(ref["key"], "") if ref.get("optional") else secret[ref["key"]]
            elif "fieldRef" in source:
                assert source["fieldRef"]["fieldPath"] == "metadata.name", source
                value = f"{RELEASE}-{self.name}-0"
            env[variable["name"]] = str(self.local(str(value)))
        return env

    def local(self, path: str) -> Path | str:
        """Where a path in the pod is here (other values as they are)."""
        if not path.startswith("/"):
            return path
        for mounted, here in self.mounts.items():
            if path == mounted or path.startswith(mounted + "/") or mounted.startswith(path + "/"):
                if mounted.startswith(path + "/"):  # a parent of a mount (a search path holding it)
                    return here.parents[len(Path(mounted).relative_to(path).parts) - 1]
                return here / Path(path).relative_to(mounted)
        return path

    def command(self, container: dict[str, Any], env: dict[str, str]) -> list[str]:
        """The image's entrypoint (`rollout`) and the container's args, as the kubelet expands them."""
        resolved = []
        for argument in container["args"]:
            argument = re.sub(r"\$\((\w+)\)", lambda match: env.get(match.group(1), ""), argument)
            argument = argument.replace("=/data", f"={self.data}")
            resolved.append(re.sub(rf"//{RELEASE}-rollout-[a-z-]+:", "//127.0.0.1:", argument))  # Services
        return [ROLLOUT, *resolved]

    def _run(self, container: dict[str, Any]) -> subprocess.Popen[bytes]:
        env = self.env_of(container)
        with (self.root / "log").open("ab") as log:
            return subprocess.Popen(
                self.command(container, env),
                cwd=self.root,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self) -> None:
        for init in self.spec.get("initContainers", []):
            done = self._run(init).wait(timeout=180)
            assert done == 0, f"{self.name}: init container {init['name']} failed:\n{self.tail()}"
        self.process = self._run(self.spec["containers"][0])

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


def secrets_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The chart's Secrets: name -> key -> value."""
    return {
        obj["metadata"]["name"]: {
            key: base64.b64decode(value or "").decode() for key, value in obj["data"].items()
        }
        for obj in objects
        if obj["kind"] == "Secret"
    }


WRITERS = ("gateway", "runner", "trainer", "serving")  # the pods this test starts, each its own login


def make_ledger_logins(settings: Settings, database: str, secrets: dict[str, dict[str, str]]) -> None:
    """What the dev Postgres does on its first start: the superuser makes the ledger's database and runs the
    chart's init script in it, with each login's password from its rendered Secret."""
    with psycopg.connect(settings.ledger_url, autocommit=True) as superuser:
        superuser.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    passwords = {
        f"LEDGER_{login.upper()}_PASSWORD": secrets[f"{RELEASE}-rollout-ledger-{login}"][key]
        for login, key in (
            ("owner", "databasePassword"),
            *((login, f"{login}Password") for login in SERVICE_LOGINS),
        )
    }
    postgres = settings.services.postgres
    done = subprocess.run(
        [
            str(binaries_dir() / "psql"),
            "-X",
            "-q",
            "-f",
            str(CHART / "files" / "postgres" / "ledger-roles.sql"),
        ],
        env={
            **os.environ,
            **passwords,
            "PGHOST": postgres.host,
            "PGPORT": str(postgres.port),
            "PGUSER": "postgres",
            "PGDATABASE": database,
            "PGPASSWORD": urlsplit(settings.ledger_url).password or "",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(900)
def test_the_charts_containers_run_as_processes_and_a_cluster_run_trains(
    services: tuple[Settings, str], tmp_path: Path, models_dir: Path, tiny_qwen3: str
) -> None:
    settings, s3_endpoint = services
    gateway_port, engine_port = free_port(), free_port()
    postgres = settings.services.postgres
    owner_url = f"postgresql://rollout@{postgres.host}:{postgres.port}/wiring"  # its password: the Secret's
    objects = render(
        {
            "model": "tiny-qwen3",
            "maxContext": 2048,
            "services": {
                "postgres": {"url": owner_url, "dev": False},
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
            "extraSettings": [f"models_dir={models_dir}"],  # the built-in models, made once per machine
        }
    )
    specs = pod_specs(objects)
    assert set(ROLES) <= specs.keys(), specs.keys()
    assert all(specs[role]["initContainers"][0]["name"] == "migrate" for role in ROLES)
    secrets = secrets_of(objects)
    make_ledger_logins(settings, "wiring", secrets)
    owner_password = secrets[f"{RELEASE}-rollout-ledger-owner"]["databasePassword"]
    config_maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    pods = {name: Pod(name, specs[name], secrets, config_maps, tmp_path / "pods") for name in ROLES}
    try:
        with ThreadPoolExecutor(len(ROLES)) as starting:  # pods start side by side, as Kubernetes starts them
            list(starting.map(Pod.start, pods.values()))
        for name in ROLES:
            wait_ready(pods[name])

        # The pods migrated as the owner, a login of no privilege, and serve as their kinds' logins.
        with psycopg.connect(settings.ledger_url.rsplit("/", 1)[0] + "/wiring") as superuser:
            owners = superuser.execute(
                "SELECT DISTINCT tableowner, rolsuper FROM pg_tables JOIN pg_roles ON rolname = tableowner"
                " WHERE schemaname = 'public'"
            ).fetchall()
            assert owners == [("rollout", False)]
            serving = superuser.execute(
                "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'wiring' AND usename <> 'postgres'"
            ).fetchall()
            assert serving and set(serving) <= {(f"rollout_{kind}",) for kind in WRITERS}, serving

        home = tmp_path / "config"
        env = {**os.environ, "ROLLOUT_CONFIG_HOME": str(home), **pods["trainer"].env}
        env.pop("ROLLOUT_DATA_DIR")  # the CLI runs on a laptop, not in a pod
        env["PGPASSWORD"] = owner_password  # an operator's commands use the owner's login
        key_file = tmp_path / "operator.key"
        key_file.write_text(secrets[f"{RELEASE}-rollout-secrets"]["operatorKey"])
        connect = [
            *("cluster", "connect", "wiring", "--postgres-url", owner_url),
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
        # Each pod wrote its part of that run (turns, episodes, checkpoints, acks) as its own login.
        with psycopg.connect(settings.ledger_url.rsplit("/", 1)[0] + "/wiring") as superuser:
            users = superuser.execute(
                "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'wiring' AND usename LIKE 'rollout_%'"
            ).fetchall()
        assert {user for (user,) in users} == {f"rollout_{kind}" for kind in WRITERS}, users

        seat = json.loads(cli(["seat", "new", "--cluster", "--json"], env, tmp_path))
        assert seat["base_url"].startswith(f"http://127.0.0.1:{gateway_port}/s/")
        reply = httpx.post(
            f"{seat['base_url']}/chat/completions",
            json={"model": "base", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text

        # The engine served the gateway, which holds its key (derived from the Secret's engineKey, mounted
        # in both pods); whoever lacks it is refused.
        engine_url = f"http://127.0.0.1:{engine_port}"
        api_key = engine_api_key(secrets[f"{RELEASE}-rollout-secrets"]["engineKey"].encode().strip())
        swap = {"lora_name": summary["checkpoints"][-1], "lora_path": str(tmp_path)}
        refused = httpx.post(f"{engine_url}/v1/load_lora_adapter", json=swap, timeout=30)
        assert refused.status_code == 401, refused.text
        models = httpx.get(
            f"{engine_url}/v1/models", headers={"authorization": f"Bearer {api_key}"}, timeout=30
        )
        assert models.status_code == 200 and "base" in {m["id"] for m in models.json()["data"]}, models.text
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
