"""What vLLM 0.33 itself decides or accepts at `vllm serve`, which rollout's settings must agree with: the
LoRA ranks its argument parser takes, and its default number of sequences scheduled at once."""

from __future__ import annotations

# vLLM 0.33's choices for `--max-lora-rank` (its argument parser refuses any other at `vllm serve`).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_default_max_num_seqs(device_gib: float) -> int:
    """vLLM 0.33's default --max-num-seqs for `vllm serve`: 1024 on a GPU of 70 GiB or more (an H100, H200),
    256 below (it keeps 256 on an A100 of 80 GiB too, which this errs above)."""
    return 1024 if device_gib >= 70 else 256
