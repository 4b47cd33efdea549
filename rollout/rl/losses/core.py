"""The step around every policy loss: it builds the token terms a loss is given (rollout.rl.losses.terms),
masks, normalises and measures (docs/rl-math.md). Pure: tensors in, a scalar loss and numbers out.

Shapes: every tensor is `[B, T]` (segments × tokens), float. `mask_BT` is 1 on sampled tokens (the only ones
that carry loss) and 0 on prompt, tool and environment tokens and padding. Logprobs are per token:
`logprobs_BT` the policy being trained (π_θ, with gradient), `behaviour_logprobs_BT` the policy that sampled
each token (μ, recorded with its turn: each token is corrected against its own sampling checkpoint),
`old_logprobs_BT` the policy at the start of this training step (π_old, detached).

Contract:
- A loss is a `PolicyLoss` (rollout.rl.losses.terms); it knows nothing of masks, normalisation or metrics.
- `policy_loss` sums the kept tokens' losses and divides by the batch's sampled tokens (token-level
  normalisation; a batch with no sampled token gives a zero loss). Tokens with mask 0 contribute nothing and
  get no gradient, whatever their values; weights are detached: gradient flows only through `logprobs_BT`.
- `LossConfig.token_mask_bounds` (IcePop) drops sampled tokens whose ratio ρ = π_θ/μ leaves [lo, hi] instead
  of clipping them, whichever the loss; the dropped fraction is reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rollout.rl.losses.ppo import PPO
from rollout.rl.losses.terms import PolicyLoss, TokenTerms

if TYPE_CHECKING:
    import torch


class NonFiniteLoss(FloatingPointError):
    """A step's loss (or gradient) is NaN or infinite: nothing was applied, nothing is published."""


def _default_loss() -> PolicyLoss:
    return PPO()


@dataclass(frozen=True)
class LossConfig:
    """The loss a trainer minimises (PPO by default) and IcePop's bounds, which apply to any loss."""

    loss: PolicyLoss = field(default_factory=_default_loss)
    token_mask_bounds: tuple[float, float] | None = None  # IcePop: drop tokens with ρ outside [lo, hi]

    def __post_init__(self) -> None:
        if not isinstance(self.loss, PolicyLoss):
            raise TypeError(
                f"{self.loss!r} is not a policy loss: it needs name, tinker, tinker_config and __call__"
            )
        if self.token_mask_bounds is not None:
            low, high = self.token_mask_bounds
            if not 0 <= low < 1 < high:
                raise ValueError(
                    f"token_mask_bounds {self.token_mask_bounds}: set [lo, hi] with 0 ≤ lo < 1 < hi"
                )


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
    import torch

    if not logprobs_BT.shape == behaviour_logprobs_BT.shape == advantages_BT.shape == mask_BT.shape:
        raise ValueError("logprobs, behaviour logprobs, advantages and mask must have one shape [B, T]")
    mask = mask_BT.detach().to(logprobs_BT.dtype)
    zeros = torch.zeros_like(mask)
    old_BT = (old_logprobs_BT if old_logprobs_BT is not None else logprobs_BT).detach()
    behaviour = behaviour_logprobs_BT.detach()
    # Padding and environment tokens may hold anything; neutral terms there keep inf/NaN out of the sums.
    terms = TokenTerms(
        logprobs=logprobs_BT,
        old_logprobs=torch.where(mask > 0, old_BT, behaviour),
        behaviour_logprobs=behaviour,
        ratio=torch.exp(torch.where(mask > 0, logprobs_BT.detach() - behaviour, zeros)),
        advantages=torch.where(mask > 0, advantages_BT.detach(), zeros),
        mask=mask,
    )
    masked_out = zeros
    if config.token_mask_bounds is not None:
        low, high = config.token_mask_bounds
        masked_out = mask * ((terms.ratio < low) | (terms.ratio > high)).to(mask.dtype)
    kept = mask - masked_out
    tokens = int(mask.sum().item())
    denominator = max(tokens, 1)
    token_loss = config.loss(terms)
    # Selecting by the mask keeps masked tokens out of the graph's gradient, even where per_token is inf.
    loss = (
        torch.where(kept > 0, token_loss.per_token, torch.zeros_like(token_loss.per_token)).sum()
        / denominator
    )

    sampled = mask > 0
    ratios = terms.ratio[sampled]
    old_log_ratio = (old_BT - behaviour)[sampled]  # log r, r = π_old/μ
    metrics = LossMetrics(
        tokens=tokens,
        ratio_mean=float(ratios.mean()) if tokens else 1.0,
        ratio_max=float(ratios.max()) if tokens else 1.0,
        clipped_fraction=float((token_loss.clipped * kept).sum() / denominator),
        masked_fraction=float(masked_out.sum() / denominator),
        effective_sample_size=_ess(ratios),
        weight_ess=_ess(token_loss.weight.detach()[kept > 0], tokens),
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
