"""What a policy loss is given and what it answers: the plug-in interface of rollout.rl.losses.

Contract:
- A loss is a `PolicyLoss`: given a batch's `TokenTerms` it returns each token's loss, the weight its gradient
  carries and whether it clipped it (`TokenLoss`), every tensor `[B, T]`. Off the mask every term is neutral
  (ratio 1, advantage 0); masking, IcePop, normalisation and metrics are done around it
  (rollout.rl.losses.core).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TokenTerms:
    """What a loss is given of a batch, each `[B, T]`; off the mask every term is neutral (ratio 1,
    advantage 0)."""

    logprobs: torch.Tensor  # π_θ, with gradient: the only term the loss may differentiate
    old_logprobs: torch.Tensor  # π_old, detached (π_θ itself on a step's first update)
    behaviour_logprobs: torch.Tensor  # μ, detached
    ratio: torch.Tensor  # ρ = π_θ/μ, detached
    advantages: torch.Tensor  # detached
    mask: torch.Tensor  # 1 on sampled tokens


@dataclass(frozen=True)
class TokenLoss:
    """A loss's answer for each token, `[B, T]`."""

    per_token: torch.Tensor  # the token's loss: what is summed, with gradient through `logprobs`
    weight: torch.Tensor  # the weight its gradient carries (detached): the weight ESS is measured on it
    clipped: torch.Tensor  # 1 where the loss capped or clipped the token


@runtime_checkable
class PolicyLoss(Protocol):
    """A policy loss (rollout.rl.losses.registry names the built-in ones and loads a researcher's own).

    `name` is what runs and logs call it; `tinker` is the Tinker built-in loss that computes the same (None:
    Tinker cannot train it, and a run on Tinker refuses it when its settings load), with `tinker_config()` its
    `loss_fn_config`."""

    @property
    def name(self) -> str: ...

    @property
    def tinker(self) -> str | None: ...

    def tinker_config(self) -> dict[str, float]: ...

    def __call__(self, terms: TokenTerms) -> TokenLoss: ...
