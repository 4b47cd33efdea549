"""Decoupled PPO (the default loss): the ratio r = π_θ/π_old clipped to [1 − clip_low, 1 + clip_high], each
token weighted by its behaviour weight π_old/μ capped at `is_cap` (docs/rl-math.md). Tinker's `ppo` computes
the same clip (without the behaviour weight, which Tinker does not apply)."""

from __future__ import annotations

from dataclasses import dataclass

from rollout.rl.losses.terms import TokenLoss, TokenTerms


@dataclass(frozen=True)
class PPO:
    is_cap: float = 2.0  # C: the cap on the behaviour weight π_old/μ
    clip_low: float = 0.2  # r is clipped to [1 − clip_low, 1 + clip_high]
    clip_high: float = 0.28

    name = "ppo"
    tinker = "ppo"

    def __post_init__(self) -> None:
        if not self.is_cap > 0:
            raise ValueError(f"is_cap {self.is_cap}: set a positive cap on the behaviour weight (2.0)")
        if not 0 <= self.clip_low < 1:
            raise ValueError(f"clip_low {self.clip_low}: set 0 or more and below 1 (0.2)")
        if not self.clip_high >= 0:
            raise ValueError(f"clip_high {self.clip_high}: set 0 or more (0.28)")

    def tinker_config(self) -> dict[str, float]:
        return {"clip_low_threshold": 1.0 - self.clip_low, "clip_high_threshold": 1.0 + self.clip_high}

    def __call__(self, terms: TokenTerms) -> TokenLoss:
        import torch

        on = terms.mask > 0
        zeros = torch.zeros_like(terms.mask)
        r = torch.exp(torch.where(on, terms.logprobs - terms.old_logprobs, zeros))
        behaviour_weight = torch.clamp(
            torch.exp(torch.where(on, terms.old_logprobs - terms.behaviour_logprobs, zeros)), max=self.is_cap
        )
        clipped_r = torch.clamp(r, 1.0 - self.clip_low, 1.0 + self.clip_high)
        advantages = terms.advantages
        per_token = behaviour_weight * torch.maximum(-advantages * r, -advantages * clipped_r)
        clipped = (
            ((advantages > 0) & (r > 1.0 + self.clip_high)) | ((advantages < 0) & (r < 1.0 - self.clip_low))
        ).to(terms.mask.dtype)
        # A clipped token's ratio carries no gradient: its weight is zero.
        weight = (behaviour_weight * r * (1.0 - clipped)).detach()
        return TokenLoss(per_token, weight, clipped)
