"""Policy losses for off-policy RL on token sequences, with their diagnostics (docs/rl-math.md). Pure: tensors
in, a scalar loss and numbers out; no I/O, no model.

Shapes: every tensor is `[B, T]` (segments × tokens), float. `mask_BT` is 1 on sampled tokens (the only ones
that carry loss) and 0 on prompt, tool and environment tokens and padding. Logprobs are per token:
`logprobs_BT` the policy being trained (π_θ, with gradient), `behaviour_logprobs_BT` the policy that sampled
each token (μ, recorded with its turn: each token is corrected against its own sampling checkpoint),
`old_logprobs_BT` the policy at the start of this training step (π_old; PPO only, detached).

Contract:
- The loss is summed over sampled tokens and divided by their number in the batch (token-level
  normalisation); a batch with no sampled token gives a zero loss.
- Tokens with mask 0 contribute nothing to the loss and get no gradient, whatever their values.
- Weights (`sg(...)`) are detached: gradient flows only through `logprobs_BT`.
- `token_mask_bounds` (IcePop) drops sampled tokens whose ratio ρ = π_θ/μ leaves [lo, hi] instead of clipping
  them; the dropped fraction is reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch


class NonFiniteLoss(FloatingPointError):
    """A step's loss (or gradient) is NaN or infinite: nothing was applied, nothing is published."""


LossKind = Literal["truncated_is", "ppo", "cispo"]


@dataclass(frozen=True)
class LossConfig:
    kind: LossKind = "ppo"
    is_cap: float = 2.0  # C: the cap on importance weights (truncated IS; PPO's behaviour weight π_old/μ)
    clip_low: float = 0.2  # PPO: r is clipped to [1 − clip_low, 1 + clip_high]
    clip_high: float = 0.28  # PPO and CISPO's upper clip
    token_mask_bounds: tuple[float, float] | None = None  # IcePop: drop tokens with ρ outside [lo, hi]

    def __post_init__(self) -> None:
        if self.kind not in ("truncated_is", "ppo", "cispo"):
            raise ValueError(f"loss kind must be truncated_is, ppo or cispo, not {self.kind!r}")
        if self.is_cap <= 0 or self.clip_low < 0 or self.clip_high < 0 or self.clip_low >= 1:
            raise ValueError("is_cap must be > 0, clip_low in [0, 1) and clip_high >= 0")


@dataclass(frozen=True)
class LossMetrics:
    tokens: int
    ratio_mean: float  # ρ = π_θ/μ over sampled tokens
    ratio_max: float
    clipped_fraction: float  # tokens whose weight or ratio was clipped
    masked_fraction: float  # tokens dropped by the IcePop bounds
    effective_sample_size: float  # (Σρ)² / Σρ² / n, in (0, 1]
    # The same of the weights the loss applies (ρ capped or clipped, IcePop's masked tokens out): how evenly
    # the gradient is spread over the tokens. Unclipped importance sampling applies ρ itself; PPO and capped
    # IS bound the weights from above, so a few large ratios cannot dominate (many small ones still lower it).
    weight_ess: float
    kl_k1: float  # mean(log μ − log π_old): sampler–trainer KL, k1 estimator
    kl_k3: float  # mean((r − 1) − log r), r = π_old/μ: the k3 estimator


def policy_loss(
    logprobs_BT: torch.Tensor,
    behaviour_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    config: LossConfig,
    old_logprobs_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """The loss to minimise and its diagnostics. `old_logprobs_BT` defaults to π_θ detached (one update per
    batch, where π_old = π_θ)."""
    if not logprobs_BT.shape == behaviour_logprobs_BT.shape == advantages_BT.shape == mask_BT.shape:
        raise ValueError("logprobs, behaviour logprobs, advantages and mask must have one shape [B, T]")
    old_BT = (old_logprobs_BT if old_logprobs_BT is not None else logprobs_BT).detach()
    mask = mask_BT.detach().to(logprobs_BT.dtype)
    behaviour = behaviour_logprobs_BT.detach()
    advantages = torch.where(mask > 0, advantages_BT.detach(), torch.zeros_like(mask))
    # Padding and environment tokens may hold anything; zero their log-ratio so no inf/NaN reaches the sums.
    log_ratio = torch.where(mask > 0, logprobs_BT.detach() - behaviour, torch.zeros_like(mask))
    ratio = torch.exp(log_ratio)

    masked_out = torch.zeros_like(mask)
    if config.token_mask_bounds is not None:
        low, high = config.token_mask_bounds
        masked_out = mask * ((ratio < low) | (ratio > high)).to(mask.dtype)
    kept = mask - masked_out
    tokens = int(mask.sum().item())
    denominator = max(tokens, 1)

    if config.kind == "truncated_is":
        weight = torch.clamp(ratio, max=config.is_cap)
        per_token = -weight * advantages * logprobs_BT
        clipped = (ratio > config.is_cap).to(mask.dtype)
    elif config.kind == "cispo":
        weight = torch.clamp(ratio, min=0.0, max=1.0 + config.clip_high)
        per_token = -weight * advantages * logprobs_BT
        clipped = (ratio > 1.0 + config.clip_high).to(mask.dtype)
    else:
        r = torch.exp(torch.where(mask > 0, logprobs_BT - old_BT, torch.zeros_like(mask)))
        behaviour_weight = torch.clamp(
            torch.exp(torch.where(mask > 0, old_BT - behaviour, torch.zeros_like(mask))), max=config.is_cap
        )
        clipped_r = torch.clamp(r, 1.0 - config.clip_low, 1.0 + config.clip_high)
        per_token = behaviour_weight * torch.maximum(-advantages * r, -advantages * clipped_r)
        clipped = (
            ((advantages > 0) & (r > 1.0 + config.clip_high))
            | ((advantages < 0) & (r < 1.0 - config.clip_low))
        ).to(mask.dtype)
        # A clipped token's ratio carries no gradient: its weight is zero.
        weight = (behaviour_weight * r * (1.0 - clipped)).detach()
    # Multiplying by the mask keeps masked tokens out of the graph's gradient, even where per_token is inf.
    loss = torch.where(kept > 0, per_token, torch.zeros_like(per_token)).sum() / denominator

    sampled = mask > 0
    ratios = ratio[sampled]
    old_log_ratio = (old_BT - behaviour)[sampled]  # log r, r = π_old/μ
    metrics = LossMetrics(
        tokens=tokens,
        ratio_mean=float(ratios.mean()) if tokens else 1.0,
        ratio_max=float(ratios.max()) if tokens else 1.0,
        clipped_fraction=float((clipped * kept).sum() / denominator),
        masked_fraction=float(masked_out.sum() / denominator),
        effective_sample_size=_ess(ratios),
        weight_ess=_ess(weight.detach()[kept > 0], tokens),
        kl_k1=float((-old_log_ratio).mean()) if tokens else 0.0,
        kl_k3=float((torch.exp(old_log_ratio) - 1 - old_log_ratio).mean()) if tokens else 0.0,
    )
    return loss, metrics


def _ess(weights: torch.Tensor, n: int | None = None) -> float:
    """(Σw)² / (n Σw²): 1 when the weights are equal, 1/n when one token holds them all (n defaults to their
    count; 1.0 with no weight, 0.0 when every weight is zero)."""
    n = int(weights.numel()) if n is None else n
    if n == 0:
        return 1.0
    squares = float(weights.pow(2).sum())
    return float(weights.sum()) ** 2 / (squares * n) if squares > 0 else 0.0


def staleness_histogram(newest_version: int, sampled_versions: Sequence[int]) -> dict[int, int]:
    """How many sampled tokens came from a checkpoint 0, 1, 2, … versions behind the newest."""
    if any(v > newest_version for v in sampled_versions):
        raise ValueError("a token cannot be sampled by a checkpoint newer than the newest")
    return dict(sorted(Counter(newest_version - v for v in sampled_versions).items()))
