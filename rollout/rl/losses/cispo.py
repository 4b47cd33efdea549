"""CISPO: REINFORCE with each token's weight ρ = π_θ/μ clipped from above at 1 + `clip_high`, so a clipped
token still carries its gradient (docs/rl-math.md). Tinker's `cispo` computes the same."""

from __future__ import annotations

from dataclasses import dataclass

from rollout.rl.losses.terms import TokenLoss, TokenTerms


@dataclass(frozen=True)
class CISPO:
    clip_high: float = 0.28  # the weight is clipped to at most 1 + clip_high
    clip_low: float = 0.2  # only Tinker's lower threshold (1 − clip_low); the local loss has no lower clip

    name = "cispo"
    tinker = "cispo"

    def __post_init__(self) -> None:
        if not self.clip_high >= 0:
            raise ValueError(f"clip_high {self.clip_high}: set 0 or more (0.28)")
        if not 0 <= self.clip_low < 1:
            raise ValueError(f"clip_low {self.clip_low}: set 0 or more and below 1 (0.2)")

    def tinker_config(self) -> dict[str, float]:
        return {"clip_low_threshold": 1.0 - self.clip_low, "clip_high_threshold": 1.0 + self.clip_high}

    def __call__(self, terms: TokenTerms) -> TokenLoss:
        import torch

        weight = torch.clamp(terms.ratio, min=0.0, max=1.0 + self.clip_high)
        clipped = (terms.ratio > 1.0 + self.clip_high).to(terms.mask.dtype)
        return TokenLoss(-weight * terms.advantages * terms.logprobs, weight, clipped)
