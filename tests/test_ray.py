"""placement=ray on CPU: a local Ray cluster (`ray start --head`, as the chart's RayCluster head) shared by
the module; an engine and a trainer worker each run by a Ray actor (the gateway samples through the engine),
each stopped with its driver; and a trainer training data-parallel on two Ray workers, across steps and a
resume."""

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
from rollout_testing.cluster import Cluster

pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).parent / "ray")


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """A one-node Ray cluster on this machine, stopped after this module's tests (its temp dir is short: Ray's
    Unix sockets live there, and their paths may not exceed 107 bytes)."""
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
def test_an_engine_placed_on_ray_serves_the_gateway_and_stops_with_its_driver(
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
    assert "local engine: placing it on the Ray cluster" in driver.log.read_text()
    serving = [c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port and c.pid]
    driven = {c.pid for c in psutil.Process(driver.process.pid).children(recursive=True)}
    assert serving and not set(serving) & driven, "the engine runs under Ray's actor, not under its driver"
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
def test_a_data_parallel_trainer_on_two_ray_workers_makes_the_one_process_updates_and_resumes(
    ray_head: str, tiny_qwen3: str, tmp_path: Path
) -> None:
    import ray
    import torch
    from safetensors.torch import load_file

    from benchmarks.gpu import synthetic_batch
    from rollout.rl.losses import PPO, LossConfig
    from rollout.training.data_parallel import DataParallel
    from rollout.training.local import LocalTrainer, LocalTrainerConfig

    config, loss = LocalTrainerConfig(lora_rank=None, learning_rate=1e-3, device="cpu"), LossConfig(PPO())
    alone = LocalTrainer(tiny_qwen3, config, loss)
    vocab = alone.model.config.vocab_size
    batches = [synthetic_batch(vocab, rows=4, length=48), synthetic_batch(vocab, rows=5, length=40)]
    expected = [alone.step(batch) for batch in batches]
    alone.save(tmp_path / "alone")
    group = DataParallel(workers=2, address=ray_head)
    try:
        parallel = group.build(tiny_qwen3, config, loss)
        got = [parallel.step(batches[0])]
        parallel.save(tmp_path / "after-one")
        parallel.close()
        resumed = group.resume(tmp_path / "after-one", config, loss)  # a new group, from the checkpoint
        assert resumed.steps == 1
        got.append(resumed.step(batches[1]))
        resumed.save(tmp_path / "parallel")
    finally:
        ray.shutdown()
    for metrics, want in zip(got, expected, strict=True):
        assert metrics["tokens"] == want["tokens"]
        assert metrics["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
        assert metrics["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    one = load_file(str(tmp_path / "alone" / "model.safetensors"))
    two = load_file(str(tmp_path / "parallel" / "model.safetensors"))
    assert one.keys() == two.keys()
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
