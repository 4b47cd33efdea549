"""GSPO-style sequence-level ratio (Zheng et al., 2025): PPO's clip applied once per sampled sequence, to the
geometric mean of its tokens' ratios s = exp(mean_t log π_θ/π_old), each sequence weighted by its behaviour
weight, the geometric mean of π_old/μ capped at `is_cap` (docs/rl-math.md). A sequence is a row of the batch:
the sampled tokens of one training sequence. Tinker has no such loss: a run on Tinker refuses it."""

from __future__ import annotations

from dataclasses import dataclass

from rollout.rl.losses.terms import TokenLoss, TokenTerms


@dataclass(frozen=True)
class GSPO:
    # The sequence ratio is clipped to [1 − clip_low, 1 + clip_high]: a mean of log-ratios moves far less
    # than a token's, so its range is 2 to 3 orders of magnitude narrower than PPO's (the paper's 3e-4, 4e-4).
    clip_low: float = 3e-4
    clip_high: float = 4e-4
    is_cap: float = 2.0  # C: the cap on the sequence's behaviour weight

    name = "gspo"
    tinker = None

    def __post_init__(self) -> None:
        if not 0 <= self.clip_low < 1:
            raise ValueError(f"clip_low {self.clip_low}: set 0 or more and below 1 (3e-4)")
        if not self.clip_high >= 0:
            raise ValueError(f"clip_high {self.clip_high}: set 0 or more (4e-4)")
        if not self.is_cap > 0:
            raise ValueError(f"is_cap {self.is_cap}: set a positive cap on the behaviour weight (2.0)")

    def tinker_config(self) -> dict[str, float]:
        return {}

    def __call__(self, terms: TokenTerms) -> TokenLoss:
        import torch

        on = terms.mask > 0
        zeros = torch.zeros_like(terms.mask)
        lengths = terms.mask.sum(dim=1, keepdim=True).clamp(min=1.0)

        def sequence_mean(log_ratio: torch.Tensor) -> torch.Tensor:  # [B, 1]
            return torch.where(on, log_ratio, zeros).sum(dim=1, keepdim=True) / lengths

        s = torch.exp(sequence_mean(terms.logprobs - terms.old_logprobs))  # with gradient
        behaviour_weight = torch.clamp(
            torch.exp(sequence_mean(terms.old_logprobs - terms.behaviour_logprobs)), max=self.is_cap
        )
        advantages = terms.advantages
        clipped_s = torch.clamp(s, 1.0 - self.clip_low, 1.0 + self.clip_high)
        # Every token of a sequence carries its sequence's term, so the sum over its tokens (then ÷ N) weighs
        # a sequence by its length, as the token-level losses do: each token's gradient is −w · A · s / N.
        per_token = behaviour_weight * torch.maximum(-advantages * s, -advantages * clipped_s)
        clipped = (
            ((advantages > 0) & (s > 1.0 + self.clip_high)) | ((advantages < 0) & (s < 1.0 - self.clip_low))
        ).to(terms.mask.dtype)
        weight = (behaviour_weight * s * (1.0 - clipped)).detach()
        return TokenLoss(per_token, weight, clipped)
