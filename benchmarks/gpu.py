"""`uv run python -m benchmarks gpu`: the local trainer's speed on a CUDA GPU, tokens/s and MFU per step.

The model is Qwen3-0.6B when pulled (`rollout models pull qwen3-0.6b`), else the shipped SmolLM2-135M. Each
step trains rank-32 LoRA on a batch of `ROWS` sequences of `LENGTH` tokens, half of each sampled (the shape of
an agent's turns: a prompt, then its reply), with micro-batches of `MICRO_TOKENS`. The baseline, in the same
run, is the device's peak bf16 throughput: MFU = model FLOPs / time / peak, with model FLOPs 4 × parameters ×
tokens for LoRA (forward 2N, backward through the frozen weights 2N, no weight gradients). The first step
(CUDA warm-up) is reported but not counted.

Target: MFU ≥ 20 % on an H100-class GPU for the 0.6B model. Without CUDA it prints why it did not run and
exits 0: there is nothing to measure.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROWS = 16
LENGTH = 1024
MICRO_TOKENS = 8192
STEPS = 6
MFU_TARGET = 0.20
# Dense bf16 tensor-core peaks (FLOP/s), by the name CUDA reports.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "4090": 165e12}


def peak_flops(device_name: str) -> float | None:
    return next((flops for key, flops in PEAK_BF16.items() if key in device_name), None)


def synthetic_batch(vocab: int, *, rows: int = ROWS, length: int = LENGTH) -> Any:
    """`rows` sequences of `length` random tokens, the second half of each sampled, advantages ±1."""
    import torch

    from rollout.rl.batches import Batch, WeightedSegment
    from rollout.rl.segments import TrainingSegment

    generator = torch.Generator().manual_seed(0)
    segments = []
    for row in range(rows):
        tokens = tuple(int(t) for t in torch.randint(100, vocab - 100, (length,), generator=generator))
        mask = (0,) * (length // 2) + (1,) * (length - length // 2)
        segment = TrainingSegment(
            segment_id=f"s{row}",
            seat="seat",
            tokens_T=tokens,
            mask_T=mask,
            behaviour_logprobs_T=tuple(-2.0 if m else 0.0 for m in mask),
            versions_T=(0,) * length,
        )
        segments.append(
            WeightedSegment(episode=f"e{row}", agent="a", advantage=1.0 if row % 2 else -1.0, segment=segment)
        )
    return Batch.of("bench", segments)


def run(steps: int = STEPS) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"benchmark": "gpu", "ran": False, "reason": "no CUDA device on this machine", "met": True}
    from rollout.config import load
    from rollout.config.catalog import pulled
    from rollout.engines.models import resolve
    from rollout.rl.losses import PPO, LossConfig
    from rollout.training.local import LocalTrainer, LocalTrainerConfig

    settings = load([])
    models_dir = Path(settings.models_dir).expanduser()
    name = "qwen3-0.6b" if pulled("qwen3-0.6b", models_dir) else "smollm2"
    config = LocalTrainerConfig(lora_rank=32, lora_alpha=64, micro_batch_tokens=MICRO_TOKENS, device="cuda")
    trainer = LocalTrainer(resolve(name, models_dir), config, LossConfig(PPO()))
    parameters = sum(p.numel() for p in trainer.model.parameters())
    batch = synthetic_batch(trainer.model.config.vocab_size)
    tokens = ROWS * LENGTH
    device = torch.cuda.get_device_name()
    peak = peak_flops(device)
    timed: list[dict[str, float]] = []
    for _ in range(steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        trainer.step(batch)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        flops = 4 * parameters * tokens / seconds
        timed.append(
            {
                "seconds": round(seconds, 3),
                "tokens_per_s": round(tokens / seconds),
                "mfu": round(flops / peak, 4) if peak else -1.0,
            }
        )
        print(f"step {len(timed)}: {seconds:.2f} s, {tokens / seconds:,.0f} tokens/s", flush=True)
    counted = timed[1:]
    mfu = statistics.median(s["mfu"] for s in counted)
    with tempfile.TemporaryDirectory() as scratch:
        trainer.save(Path(scratch) / "checkpoint")  # the step's output is a checkpoint: saving must work too
    return {
        "benchmark": "gpu",
        "ran": True,
        "model": name,
        "parameters": parameters,
        "device": device,
        "host": platform.node(),
        "tokens_per_step": tokens,
        "steps": timed,
        "tokens_per_s_p50": statistics.median(s["tokens_per_s"] for s in counted),
        "mfu_p50": mfu,
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 1024**3, 2),
        "met": peak is None or mfu >= MFU_TARGET,
    }


def main(*, quick: bool = False) -> int:
    summary = run(steps=3 if quick else STEPS)
    print(json.dumps(summary))
    return 0 if summary["met"] else 1
