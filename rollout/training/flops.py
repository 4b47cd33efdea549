"""Model FLOPs utilisation: what a training step computed, against what its hardware could have.

Contract:
- `training_flops_per_token(total, trainable)` is the model FLOPs one token costs a training step: 2 per
  parameter forward, 2 per parameter for the gradient of the activations backward, and 2 more per
  trainable parameter for the weights' own gradient (4N + 2N_trainable: full fine-tuning is the usual 6N;
  LoRA, about 4N). Attention's own FLOPs (quadratic in the context) are left out, as in the usual 6N: at the
  contexts trained here they are a few percent.
- `peak_tflops(device_name)` is the hardware's dense bf16 peak, in TFLOPs, from `PEAK_BF16_TFLOPS` (NVIDIA's
  data sheets, without sparsity), matched on the CUDA device's name; None for a device it does not know (any
  CPU: a CPU's peak depends on its cores, clock and vector units, which torch does not report), and then a
  step records its achieved TFLOPs/s but no MFU.
"""

from __future__ import annotations

# Dense bf16 tensor-core peak (no sparsity), by a part of the name torch.cuda.get_device_name() gives. The
# first match wins: more specific names first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
    ("V100", 125.0),  # fp16: V100 has no bf16
    ("T4", 65.0),  # fp16
)


def training_flops_per_token(total_parameters: int, trainable_parameters: int) -> float:
    return 4.0 * total_parameters + 2.0 * trainable_parameters


def peak_tflops(device_name: str) -> float | None:
    for part, tflops in PEAK_BF16_TFLOPS:
        if part in device_name:
            return tflops
    return None
