"""`rollout engine follow` beside an engine it did not start: the local engine over vLLM's HTTP API (a
stand-in for a `vllm serve` the user started, which needs a GPU), and `rollout engine serve --kind vllm`
running a named fake `vllm` as its child with the follower beside it. It hot-loads each LoRA checkpoint the
trainer publishes, unloads those that fall out of the newest `keep`, and acks what the engine serves. A
checkpoint whose files fail to load is reported and tried again with backoff until it loads."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import pytest

from rollout.blobs import FileBlobStore
from rollout.engines.protocol import EngineError
from rollout.engines.vllm_client import VLLMEngine
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import SERVING_ACKS, SERVING_TARGETS
from rollout.records.checkpoints import CheckpointFile
from rollout.records.serving import ServingAck, ServingTarget
from rollout.serving.keys import load_engine_api_key, load_serving_key
from rollout_testing.cluster import Cluster
from tests.test_chaos_episodes import wait_for

pytestmark = pytest.mark.slow


def adapter(base: str, directory: Path, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    model.save_pretrained(str(directory))
    return directory


def upload(store: FileBlobStore, directory: Path, prefix: str) -> dict[str, CheckpointFile]:
    return {
        path.name: CheckpointFile.stored(
            f"{prefix}/{path.name}", store.put(f"{prefix}/{path.name}", path.read_bytes())
        )
        for path in sorted(directory.iterdir())
        if path.is_file()
    }


async def newest_ack(ledger: Ledger, engine: str) -> ServingAck | None:
    acks = [
        ServingAck.from_payload(dict(e.payload))
        for e in await ledger.read(SERVING_ACKS)
        if e.kind == Kind.SERVING_ACK and e.payload.get("engine") == engine
    ]
    return acks[-1] if acks else None


@pytest.mark.timeout(300)
async def test_a_follower_hot_loads_and_unloads_the_adapters_of_an_engine_it_did_not_start(
    cluster: Cluster, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    _, url = cluster.local_engine("unfollowed", follow=False)
    run, policy = f"follow-{uuid.uuid4().hex[:6]}", f"p{uuid.uuid4().hex[:6]}"
    name = f"followed-{run}"
    cluster.follower(name, url, "--kind", "local", "--run", run)
    store = FileBlobStore(cluster.root / "blobs")
    engine = VLLMEngine(url, api_key=load_engine_api_key(cluster.root), name=name)
    try:
        for version in (1, 2, 3):
            checkpoint = f"{policy}-{version}"
            files = upload(store, adapter(tiny_qwen3, tmp_path / checkpoint, version), f"ckpt/{checkpoint}")
            target = ServingTarget(policy, checkpoint, version, run, "lora", files).signed(
                load_serving_key(cluster.root)
            )
            await ledger.append_one(
                SERVING_TARGETS, NewEvent(target.key, Kind.SERVING_TARGET, target.to_payload())
            )

            async def acked(checkpoint: str = checkpoint) -> ServingAck | None:
                ack = await newest_ack(ledger, name)
                return ack if ack is not None and ack.serves(checkpoint) else None

            await wait_for(acked, 120, f"the follower to ack {checkpoint}")
            assert checkpoint in await engine.models(), "the engine itself serves what the follower acked"

        async def unloaded() -> list[str] | None:
            models = await engine.models()
            return models if f"{policy}-1" not in models else None

        # keep=2: the oldest leaves the ack at once and the engine after the grace period.
        models = await wait_for(unloaded, 60, "the oldest adapter to be unloaded")
        assert sorted(models) == sorted(["base", f"{policy}-2", f"{policy}-3"])
        ack = await newest_ack(ledger, name)
        assert ack is not None and not ack.serves(f"{policy}-1") and ack.failed is None

        # A fourth checkpoint whose weights blob is damaged: reported, retried, and served once repaired.
        broken = f"{policy}-4"
        directory = adapter(tiny_qwen3, tmp_path / broken, 4)
        files = upload(store, directory, f"ckpt/{broken}")
        weights = files["adapter_model.safetensors"]
        store.put(weights.key, b"not the recorded bytes")
        target = ServingTarget(policy, broken, 4, run, "lora", files).signed(load_serving_key(cluster.root))
        await ledger.append_one(
            SERVING_TARGETS, NewEvent(target.key, Kind.SERVING_TARGET, target.to_payload())
        )

        async def retried() -> ServingAck | None:
            ack = await newest_ack(ledger, name)
            failed = ack.failed if ack is not None else None
            return ack if failed and failed["checkpoint"] == broken and int(failed["attempts"]) >= 2 else None

        ack = await wait_for(retried, 60, "the follower to report two failed loads of the damaged checkpoint")
        assert ack.failed is not None and "BlobIntegrityError" in ack.failed["error"]
        assert ack.serves(f"{policy}-3"), "the engine keeps serving what it served"
        store.put(weights.key, (directory / "adapter_model.safetensors").read_bytes())

        async def repaired() -> ServingAck | None:
            ack = await newest_ack(ledger, name)
            return ack if ack is not None and ack.serves(broken) else None

        ack = await wait_for(repaired, 60, "the repaired checkpoint to load on a retry")
        assert ack.failed is None and broken in await engine.models()
    finally:
        await engine.close()


@pytest.mark.timeout(300)
async def test_engine_serve_kind_vllm_runs_vllm_as_its_child_follows_it_and_stops_it(
    cluster: Cluster, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    """`rollout engine serve --kind vllm` with the named fake `vllm` (tests/fake_vllm.py) first on PATH."""
    bin_dir = fake_vllm_on_path(tmp_path / "bin")
    run, policy = f"vllm-{uuid.uuid4().hex[:6]}", f"p{uuid.uuid4().hex[:6]}"
    name = f"vllm-{run}"
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    service, url = cluster.vllm_engine(name, env={"PATH": path, "ROLLOUT_DATA_DIR": str(cluster.root)})
    engine = VLLMEngine(url, api_key=load_engine_api_key(cluster.root), name=name)
    store = FileBlobStore(cluster.root / "blobs")
    try:
        # The follower in `engine serve` serves every run's checkpoints; this one's is what the test
        # publishes.
        checkpoint = f"{policy}-1"
        files = upload(store, adapter(tiny_qwen3, tmp_path / checkpoint, 1), f"ckpt/{checkpoint}")
        target = ServingTarget(policy, checkpoint, 1, run, "lora", files).signed(
            load_serving_key(cluster.root)
        )
        await ledger.append_one(
            SERVING_TARGETS, NewEvent(target.key, Kind.SERVING_TARGET, target.to_payload())
        )

        async def acked() -> ServingAck | None:
            ack = await newest_ack(ledger, name)
            return ack if ack is not None and ack.serves(checkpoint) else None

        await wait_for(acked, 120, f"the follower beside vLLM to ack {checkpoint}")
        assert checkpoint in await engine.models(), "vLLM (the fake) hot-loaded the adapter"
        # vLLM got the engine API key in its environment (the fake checks it), and demands it.
        keyless = VLLMEngine(url, api_key=None)
        try:
            with pytest.raises(EngineError, match="401"):
                await keyless.models()
        finally:
            await keyless.close()
    finally:
        await engine.close()
    service.stop()
    assert not port_open(int(url.rsplit(":", 1)[1])), "stopping `engine serve` stops the vLLM it started"
    assert "vLLM is serving" in service.log.read_text()  # the whole log: later lines may fill the tail


def fake_vllm_on_path(bin_dir: Path) -> Path:
    """A folder holding a `vllm` that runs tests/fake_vllm.py."""
    bin_dir.mkdir()
    repo = Path(__file__).resolve().parent.parent
    fake = bin_dir / "vllm"
    fake.write_text(f'#!/bin/sh\ncd {repo} && exec {sys.executable} -m tests.fake_vllm "$@"\n')
    fake.chmod(0o755)
    return bin_dir


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0
