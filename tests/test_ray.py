"""placement=ray on CPU: a local Ray cluster (`ray start --head`, as the chart's RayCluster head) shared by the
module; an engine as a Ray actor that the gateway samples through, a trainer worker placed by a Ray actor, each
stopped with its driver; and a data-parallel step on two Ray Train workers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from rollout.net import free_port
from tests.cluster import Cluster

pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).parent / "ray")


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """A one-node Ray cluster on this machine, stopped after this module's tests (its temp dir is short: Ray's Unix sockets
    live there, and their paths may not exceed 107 bytes)."""
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    started = subprocess.run(
        [
            RAY,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            "--num-gpus=0",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120, env=env)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.timeout(400)
def test_an_engine_runs_as_a_ray_actor_the_gateway_samples_through_it_and_it_stops_with_its_driver(
    cluster: Cluster, ray_head: str, tiny_qwen3: str
) -> None:
    port = free_port()
    driver = cluster._start(
        "engine-on-ray",
        "engine",
        "serve",
        "--placement",
        "ray",
        "--ray-address",
        ray_head,
        "--model",
        "tiny-qwen3",
        "--device",
        "cpu",
        "--no-follow",
        "--port",
        str(port),
    )
    cluster._ready(driver, port, timeout_s=240)
    cluster._logged(driver, "serving as a Ray actor at http://", timeout_s=60)
    engine_url = f"http://127.0.0.1:{port}"
    gateway_url = cluster.gateway(engine_url)
    seat = subprocess.run(
        ["rollout", "seat", "new", "--gateway-url", gateway_url, "--json", *cluster._overrides()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seat.returncode == 0, seat.stderr
    base_url = json.loads(seat.stdout)["base_url"]
    reply = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": "base", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["role"] == "assistant"

    driver.stop()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and engine_answers(engine_url):
        time.sleep(1)
    assert not engine_answers(engine_url), "Ray kills a driver's actors when the driver goes"


@pytest.mark.timeout(300)
def test_a_trainer_worker_placed_on_ray_polls_its_queue_and_stops_with_its_driver(
    cluster: Cluster, ray_head: str, tiny_qwen3: str
) -> None:
    holder = f"ray-trainer-{uuid.uuid4().hex[:8]}"
    driver = cluster._start(
        "trainer-on-ray",
        "worker",
        "trainer",
        "--placement",
        "ray",
        "--ray-address",
        ray_head,
        "--holder",
        holder,
        "--task-queue",
        f"trainer-{holder}",
        "trainer.model=tiny-qwen3",
        "trainer.device=cpu",
    )
    cluster._logged(driver, f"trainer worker {holder} on queue", timeout_s=240)
    placed = [p for p in psutil.process_iter(["cmdline"]) if holder in " ".join(p.info["cmdline"] or [])]
    worker = [p for p in placed if p.pid != driver.process.pid and "--placement" not in p.info["cmdline"]]
    assert len(worker) == 1, [p.info["cmdline"] for p in placed]
    assert worker[0].pid not in {
        c.pid for c in psutil.Process(driver.process.pid).children(recursive=True)
    }, "the worker runs under Ray's actor, not under its driver"
    driver.stop()
    gone, _ = psutil.wait_procs(worker, timeout=60)
    assert gone, "a placed worker stops when its driver goes"


def engine_answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(600)
def test_a_data_parallel_step_on_two_ray_workers_makes_the_one_process_update(
    ray_head: str, tiny_qwen3: str, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    from benchmarks.gpu import synthetic_batch
    from rollout.stack.ray_train import data_parallel_step
    from rollout.training.local import LocalTrainer, LocalTrainerConfig
    from rollout.training.losses import LossConfig

    config = LocalTrainerConfig(lora_rank=None, learning_rate=1e-3, device="cpu")
    alone = LocalTrainer(tiny_qwen3, config, LossConfig("ppo"))
    batch = synthetic_batch(alone.model.config.vocab_size, rows=4, length=48)
    expected = alone.step(batch)
    alone.save(tmp_path / "alone")
    metrics = data_parallel_step(
        model_path=tiny_qwen3,
        trainer_config=config,
        loss=LossConfig("ppo"),
        batch=batch,
        output=tmp_path / "parallel",
        workers=2,
        address=ray_head,
        storage=tmp_path / "ray-results",
    )
    assert metrics["workers"] == 2.0 and metrics["tokens"] == expected["tokens"]
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-4, abs=1e-6)
    assert metrics["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
    one = load_file(str(tmp_path / "alone" / "model.safetensors"))
    two = load_file(str(tmp_path / "parallel" / "model.safetensors"))
    assert one.keys() == two.keys()
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
