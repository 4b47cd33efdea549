"""The GPU acceptance run: what only a CUDA device can show, checked in one go, one JSON line printed last.

`bash scripts/gpu_check.sh` (or `python scripts/gpu_check.py [--model DIR]`) on a machine with one CUDA GPU.
It needs only what can be carried there: the repository, torch, transformers and peft, and a small model
directory (default: the shipped tiny Qwen3, built by `rollout.engines.models.resolve`; no hub access). Each
check reports `ok`, `failed` (with why) or `skipped` (with why), and its seconds; progress goes to stderr.
Exit status 1 when any check failed. The checks:

- `trainer_bf16`: the local trainer on CUDA holds its base in bf16, steps (finite loss, the adapter moves),
  its sampled-token logprobs agree with a float32 copy on CPU, and `offload` gives the device's memory back.
- `engine_cuda`: the local engine on CUDA samples the same tokens for the same seed before and after a sleep,
  holds (almost) no device memory asleep, and refuses a sample while asleep.
- `one_gpu_order`: one-GPU mode's hand-over in order: the engine sleeps, the trainer comes onto the device,
  steps, saves and leaves, the engine wakes and loads the new adapter, which changes its fixed-seed output,
  and still does after another sleep and wake.
- `vllm`: with vLLM installed, the `gpu`-marked tests (tests/test_gpu.py, tests/test_vllm_launcher.py,
  tests/test_vllm_gpu.py): vLLM serves and samples token-exactly through the gateway, an adapter changes
  fixed-seed output across sleep and wake, an aborted turn is never trained, and the one-GPU order on the real
  stack. Without vLLM it is skipped, saying so.

What it cannot cover without a hub: Qwen3.5-9B itself (the minecraft-one-gpu preset's model, 4-bit through
vllm-bnb-plugin) and the preset's real memory peak; docs/serving.md says how to run those by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPT = (151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198)  # a chat turn's token ids (Qwen3's)
MIB = 1024**2
DEVICE = "cuda"  # `--device cpu` rehearses the checks' logic on a machine without a GPU (no memory checks)
VLLM_TIMEOUT_S = 540


class Skipped(Exception):
    """The check cannot run here; the message says why."""


def changed(before: Any, after: Any) -> bool:
    """Whether two samples of one prompt and seed differ by more than float noise: other tokens, or logprobs
    0.05 apart on average."""
    if before.completion_ids != after.completion_ids:
        return True
    gaps = [abs(a - b) for a, b in zip(before.logprobs, after.logprobs, strict=True)]
    return sum(gaps) / max(len(gaps), 1) > 0.05


def log(message: str) -> None:
    print(f"gpu_check: {message}", file=sys.stderr, flush=True)


def batch_for(vocab: int) -> Any:
    """Eight sequences of 96 tokens, the second half sampled, advantages ±1: enough to move an adapter."""
    from benchmarks.gpu import synthetic_batch

    return synthetic_batch(vocab, rows=8, length=96)


def trainer_config(**overrides: Any) -> Any:
    from rollout.training.local import LocalTrainerConfig

    return LocalTrainerConfig(**{"lora_rank": 8, "learning_rate": 5e-2, "device": DEVICE, **overrides})


def check_trainer_bf16(model: str) -> dict[str, Any]:
    import torch

    from rollout.rl.losses import LossConfig
    from rollout.training.local import LocalTrainer

    trainer = LocalTrainer(model, trainer_config(), LossConfig())
    base = next(p for n, p in trainer.model.named_parameters() if "embed_tokens" in n)
    wanted = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    assert base.dtype == wanted and base.device.type == DEVICE, f"base is {base.dtype} on {base.device}"
    before = [p.detach().float().clone() for p in trainer.parameters]
    batch = batch_for(trainer.model.config.vocab_size)
    losses = []
    for _ in range(3):
        metrics = trainer.step(batch)
        assert math.isfinite(metrics["loss"]), f"loss {metrics['loss']}"
        losses.append(metrics["loss"])
    moved = max(
        (p.detach().float() - b).abs().max().item() for p, b in zip(trainer.parameters, before, strict=True)
    )
    assert moved > 0, "three steps left the adapter where it was"

    # The trainer's logprob of each sampled token, bf16 on CUDA, against the same weights in float32 on CPU.
    ids = torch.tensor([list(batch.segments[0].segment.tokens_T)])
    with torch.no_grad():
        on_gpu = torch.log_softmax(trainer.model(ids.to(DEVICE)).logits.float(), -1)[0, :-1]
        reference = trainer.model.to("cpu", torch.float32)
        on_cpu = torch.log_softmax(reference(ids).logits.float(), -1)[0, :-1]
    targets = ids[0, 1:]
    gap = (on_gpu.cpu().gather(-1, targets[:, None]) - on_cpu.gather(-1, targets[:, None])).abs().max().item()
    assert gap < 0.1, f"bf16 logprobs differ from float32 by {gap:.3f}"
    del trainer, reference, before, base, on_gpu
    baseline = _allocated()
    trainer = LocalTrainer(model, trainer_config(), LossConfig())
    trainer.step(batch)
    held = _allocated() - baseline
    trainer.offload()
    left = _allocated() - baseline
    assert left <= held / 4, f"offload left {left / MIB:.1f} of {held / MIB:.1f} MiB on the device"
    return {
        "losses": losses,
        "adapter_moved": moved,
        "logprob_gap": gap,
        "offload_mib": [held / MIB, left / MIB],
    }


def _allocated() -> int:
    """The device memory this process's tensors hold, once what is no longer referenced is freed."""
    import gc

    import torch

    gc.collect()
    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


async def _engine_checks(model: str) -> dict[str, Any]:
    from rollout.engines.local import LocalEngine
    from rollout.engines.protocol import EngineUnavailable, SampleRequest

    baseline = _allocated()
    engine = LocalEngine(model, device=DEVICE)
    request = SampleRequest(PROMPT, max_tokens=12, seed=7)
    first = await engine.sample(request)
    again = await engine.sample(request)
    assert first.completion_ids == again.completion_ids, "the same seed sampled different tokens"
    awake = _allocated() - baseline
    await engine.sleep()
    asleep = _allocated() - baseline
    assert asleep <= awake / 4, f"asleep the engine still holds {asleep / MIB:.1f} of {awake / MIB:.1f} MiB"
    try:
        await engine.sample(request)
        raise AssertionError("a sleeping engine sampled")
    except EngineUnavailable:
        pass
    await engine.wake()
    woken = await engine.sample(request)
    assert woken.completion_ids == first.completion_ids, "sleep and wake changed the fixed-seed output"
    drift = max(abs(a - b) for a, b in zip(woken.logprobs, first.logprobs, strict=True))
    assert drift < 1e-3, f"sleep and wake moved the logprobs by {drift}"
    return {
        "tokens": list(first.completion_ids),
        "memory_mib": {"awake": awake / MIB, "asleep": asleep / MIB},
    }


def check_engine_cuda(model: str) -> dict[str, Any]:
    return asyncio.run(_engine_checks(model))


async def _one_gpu_order(model: str) -> dict[str, Any]:
    import torch

    from rollout.engines.local import LocalEngine
    from rollout.engines.protocol import CheckpointRef, SampleRequest
    from rollout.rl.losses import LossConfig
    from rollout.training.local import LocalTrainer

    order: list[str] = []
    engine = LocalEngine(model, device=DEVICE)
    request = SampleRequest(PROMPT, max_tokens=16, seed=11)
    base = await engine.sample(request)
    trainer = LocalTrainer(model, trainer_config(), LossConfig())
    trainer.offload()  # between steps its weights wait in CPU memory
    batch = batch_for(trainer.model.config.vocab_size)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "step1"
        await engine.sleep()
        order.append("engine asleep")
        trainer.onload()
        for _ in range(5):
            trainer.step(batch)
        peak = torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0
        trainer.save(checkpoint)
        trainer.offload()
        order.append("trained and saved")
        await engine.wake()
        order.append("engine awake")
        await engine.load(CheckpointRef("step1", str(checkpoint)))
        tuned = await engine.sample(SampleRequest(PROMPT, max_tokens=16, seed=11, model="step1"))
        assert changed(base, tuned), "the new adapter did not change the fixed-seed output"
        await engine.sleep()
        await engine.wake()
        after = await engine.sample(SampleRequest(PROMPT, max_tokens=16, seed=11, model="step1"))
        assert after.completion_ids == tuned.completion_ids, (
            "the adapter's output changed across sleep and wake"
        )
        order.append("adapter served across sleep and wake")
    return {"order": order, "peak_mib": peak / MIB}


def check_one_gpu_order(model: str) -> dict[str, Any]:
    return asyncio.run(_one_gpu_order(model))


def check_vllm(model: str) -> dict[str, Any]:
    if importlib.util.find_spec("vllm") is None:
        raise Skipped("vLLM is not installed in this Python (`uv sync --extra vllm` on the GPU machine)")
    tests = ["tests/test_gpu.py", "tests/test_vllm_launcher.py", "tests/test_vllm_gpu.py"]
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *tests]
    log(f"running {' '.join(command[2:])} (at most {VLLM_TIMEOUT_S} s)")
    # A session of its own: on a timeout the `vllm serve` processes the tests started go with pytest, rather
    # than holding the GPU's memory after the check.
    tests_run = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = tests_run.communicate(timeout=VLLM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(tests_run.pid, signal.SIGKILL)
        output, _ = tests_run.communicate()
        raise AssertionError(f"the vLLM tests ran past {VLLM_TIMEOUT_S} s:\n{output[-2000:]}") from None
    tail = output.strip().splitlines()[-15:]
    assert tests_run.returncode == 0, "\n".join(tail)
    return {"summary": tail[-1] if tail else ""}


CHECKS: dict[str, Callable[[str], dict[str, Any]]] = {
    "trainer_bf16": check_trainer_bf16,
    "engine_cuda": check_engine_cuda,
    "one_gpu_order": check_one_gpu_order,
    "vllm": check_vllm,
}


def default_model() -> str:
    from rollout.engines.models import TINY_QWEN3, resolve

    return resolve(TINY_QWEN3, Path.home() / ".cache" / "rollout-tests" / "models")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="a small model directory (default: the shipped tiny Qwen3)")
    parser.add_argument("--only", action="append", choices=list(CHECKS), help="run only these checks")
    parser.add_argument("--device", default="cuda", help="cpu rehearses the checks without a GPU")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    report: dict[str, Any] = {"checks": {}}
    try:
        import torch

        if DEVICE == "cuda" and not torch.cuda.is_available():
            raise Skipped("no CUDA device")
        report["gpu"] = torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE
        report["torch"] = torch.__version__
        model = args.model or default_model()
    except (ImportError, Skipped) as error:
        report["error"] = f"cannot run the GPU checks here: {error}"
        print(json.dumps(report))
        return 1
    for name, check in CHECKS.items():
        if args.only and name not in args.only:
            continue
        log(f"{name} …")
        started = time.monotonic()
        try:
            result: dict[str, Any] = {"status": "ok", **check(model)}
        except Skipped as why:
            result = {"status": "skipped", "why": str(why)}
        except Exception as error:  # a failed check is reported and the others still run
            result = {"status": "failed", "why": f"{type(error).__name__}: {error}"}
        result["seconds"] = round(time.monotonic() - started, 2)
        report["checks"][name] = result
        log(f"{name}: {result['status']} ({result['seconds']} s)")
    statuses = [c["status"] for c in report["checks"].values()]
    report.update({s: statuses.count(s) for s in ("ok", "failed", "skipped")})
    print(json.dumps(report))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
