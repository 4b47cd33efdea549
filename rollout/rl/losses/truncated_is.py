"""Truncated importance sampling: a REINFORCE step with each token's weight ρ = π_θ/μ capped at `is_cap`
(docs/rl-math.md). Tinker's `importance_sampling` applies no cap (the trainer reports the ratios it saw)."""

from __future__ import annotations

from dataclasses import dataclass

from rollout.rl.losses.terms import TokenLoss, TokenTerms


@dataclass(frozen=True)
class TruncatedIS:
    is_cap: float = 2.0  # C: the cap on each token's importance weight

    name = "truncated_is"
    tinker = "importance_sampling"

    def __post_init__(self) -> None:
        if not self.is_cap > 0:
            raise ValueError(f"is_cap {self.is_cap}: set a positive cap on the importance weight (2.0)")

    def tinker_config(self) -> dict[str, float]:
        return {}

    def __call__(self, terms: TokenTerms) -> TokenLoss:
        import torch

        weight = torch.clamp(terms.ratio, max=self.is_cap)
        clipped = (terms.ratio > self.is_cap).to(terms.mask.dtype)
        return TokenLoss(-weight * terms.advantages * terms.logprobs, weight, clipped)
