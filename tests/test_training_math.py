"""The training math against hand-computed values (docs/rl-math.md): advantages, the three losses, their
gradients, token masks and diagnostics."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from rollout.rl.advantages import AdvantageError, advantage_from, group_advantages, group_norm, leave_one_out
from rollout.rl.losses import (
    BUILT_IN,
    CISPO,
    PPO,
    LossConfig,
    LossError,
    TruncatedIS,
    loss_from,
    policy_loss,
    staleness_histogram,
)
from rollout.rl.losses.gspo import GSPO


def log(*probabilities: float) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probabilities]], dtype=torch.float64)


def test_group_normalised_and_leave_one_out_advantages() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0]
    # mean 0.5, population std 0.5
    assert group_norm(rewards, eps=0.0) == [1.0, -1.0, -1.0, 1.0]
    assert group_advantages(rewards, "group_norm") == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    # R_i − mean of the others: 1 − 1/3, 0 − 2/3
    assert group_advantages(rewards, "leave_one_out") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert group_advantages([0.5, 0.5, 0.5], "group_norm") is None, "no signal: skipped, not trained on"
    assert group_advantages([1.0], "leave_one_out") is None
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, math.nan])


def test_an_advantage_method_of_your_own_is_a_function_and_is_held_to_one_finite_advantage_each() -> None:
    def ranked(rewards: Sequence[float]) -> list[float]:
        order = sorted(range(len(rewards)), key=lambda i: rewards[i])
        return [float(order.index(i)) - (len(rewards) - 1) / 2 for i in range(len(rewards))]

    assert group_advantages([0.1, 0.9, 0.5], ranked) == [-1.0, 1.0, 0.0]
    assert advantage_from("leave_one_out") is leave_one_out
    for wrong in (lambda rewards: [1.0], lambda rewards: [math.inf] * len(rewards)):
        with pytest.raises(AdvantageError, match="one finite advantage per episode"):
            group_advantages([0.0, 1.0], wrong)
    with pytest.raises(AdvantageError, match="no advantage method 'grpo': name a built-in one"):
        advantage_from("grpo")
    with pytest.raises(AdvantageError, match="is a float, not a function"):
        advantage_from("math:pi")
    assert advantage_from("statistics:fmean") is not None, "any function, by its import path"


def test_truncated_importance_sampling_caps_weights_and_masks_tokens() -> None:
    logprobs = log(0.5, 0.2, 0.9).requires_grad_()
    behaviour = log(0.25, 0.4, 0.3)  # ρ = 2.0, 0.5, 3.0
    advantages = torch.full((1, 3), 1.5, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, metrics = policy_loss(logprobs, behaviour, advantages, mask, LossConfig(TruncatedIS(is_cap=1.5)))
    expected = -(1.5 * 1.5 * math.log(0.5) + 0.5 * 1.5 * math.log(0.2)) / 2
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([-1.5 * 1.5 / 2, -0.5 * 1.5 / 2, 0.0])
    assert (
        metrics.tokens == 2
        and metrics.ratio_mean == pytest.approx(1.25)
        and metrics.ratio_max == pytest.approx(2.0)
    )
    assert metrics.clipped_fraction == pytest.approx(0.5)
    assert metrics.effective_sample_size == pytest.approx(2.5**2 / ((4 + 0.25) * 2))
    # The weights applied are 1.5 (capped) and 0.5: their spread, not the ratios', is what the gradient sees.
    assert metrics.weight_ess == pytest.approx(2.0**2 / ((1.5**2 + 0.5**2) * 2))


def test_decoupled_ppo_clips_the_ratio_to_the_old_policy_and_weights_by_old_over_behaviour() -> None:
    logprobs = log(0.6, 0.3, 0.525).requires_grad_()
    old = log(0.5, 0.5, 0.5)
    behaviour = log(0.25, 0.5, 0.5)  # π_old/μ = 2, 1, 1
    advantages = torch.tensor([[1.0, -2.0, 1.0]], dtype=torch.float64)
    mask = torch.ones((1, 3), dtype=torch.float64)
    config = LossConfig(PPO(is_cap=3.0, clip_low=0.2, clip_high=0.1))
    loss, metrics = policy_loss(logprobs, behaviour, advantages, mask, config, old_logprobs_BT=old)
    # r = 1.2 (A > 0: clipped to 1.1), 0.6 (A < 0: clipped to 0.8), 1.05 (inside the range)
    assert loss.item() == pytest.approx((2.0 * -1.1 + 1.0 * 2.0 * 0.8 + 1.0 * -1.05) / 3)
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, 0.0, -1.05 / 3]), (
        "clipped tokens carry no gradient"
    )
    assert metrics.clipped_fraction == pytest.approx(2 / 3)
    assert metrics.weight_ess == pytest.approx(1 / 3), "one token of three carries the whole gradient"
    assert metrics.kl_k1 == pytest.approx((math.log(0.25) - math.log(0.5)) / 3)
    assert metrics.kl_k3 == pytest.approx((2 - 1 - math.log(2)) / 3)


def test_cispo_clips_and_detaches_the_weight_and_keeps_every_token_in_the_gradient() -> None:
    logprobs = log(0.5, 0.2).requires_grad_()
    behaviour = log(0.25, 0.4)  # ρ = 2.0, 0.5
    advantages = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones((1, 2), dtype=torch.float64)
    loss, metrics = policy_loss(logprobs, behaviour, advantages, mask, LossConfig(CISPO(clip_high=0.28)))
    assert loss.item() == pytest.approx(-(1.28 * math.log(0.5) - 0.5 * math.log(0.2)) / 2)
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([-1.28 / 2, 0.5 / 2])
    assert metrics.clipped_fraction == pytest.approx(0.5)


def test_gspo_clips_each_sequence_once_by_the_geometric_mean_of_its_ratios() -> None:
    # Row 0: π_θ = π_old (s = 1), behaviour weights 2 and 0.5 (their geometric mean: w = 1). Row 1: one
    # sampled token whose π_θ/π_old = 2 (s = 2, past 1 + ε_high with A > 0: clipped), then padding.
    logprobs = torch.tensor([[math.log(0.5), math.log(0.2)], [math.log(0.6), -math.inf]], dtype=torch.float64)
    logprobs.requires_grad_()
    old = torch.tensor([[math.log(0.5), math.log(0.2)], [math.log(0.3), 0.0]], dtype=torch.float64)
    behaviour = torch.tensor([[math.log(0.25), math.log(0.4)], [math.log(0.3), 0.0]], dtype=torch.float64)
    advantages = torch.ones((2, 2), dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    config = LossConfig(loss_from("gspo"))
    loss, metrics = policy_loss(logprobs, behaviour, advantages, mask, config, old_logprobs_BT=old)
    assert loss.item() == pytest.approx((-1.0 - 1.0 - 1.0004) / 3), "row 1 at its clip, 1 + 4e-4"
    loss.backward()
    assert logprobs.grad is not None
    # Each token of an unclipped sequence: −w · A · s / N; a clipped sequence's tokens get none.
    assert logprobs.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, 0.0, 0.0])
    assert metrics.clipped_fraction == pytest.approx(1 / 3)
    made = loss_from("gspo", {"clip_high": 1.5})
    assert isinstance(made, GSPO) and made.clip_high == 1.5
    with pytest.raises(LossError, match=r"clip_low 1\.0: set 0 or more and below 1"):
        loss_from("gspo", {"clip_low": 1.0})


def test_icepop_bounds_drop_tokens_instead_of_clipping_them() -> None:
    logprobs = log(0.5, 0.2, 0.3).requires_grad_()
    behaviour = log(0.25, 0.4, 0.3)  # ρ = 2.0, 0.5, 1.0
    advantages = torch.ones((1, 3), dtype=torch.float64)
    mask = torch.ones((1, 3), dtype=torch.float64)
    config = LossConfig(TruncatedIS(is_cap=10.0), token_mask_bounds=(0.6, 1.8))
    loss, metrics = policy_loss(logprobs, behaviour, advantages, mask, config)
    assert loss.item() == pytest.approx(-math.log(0.3) / 3), "normalised by every sampled token"
    loss.backward()
    assert logprobs.grad is not None and logprobs.grad[0].tolist() == pytest.approx([0.0, 0.0, -1 / 3])
    assert metrics.masked_fraction == pytest.approx(2 / 3)


KINDS = list(BUILT_IN)


@pytest.mark.parametrize("kind", KINDS)
def test_masked_tokens_carry_no_gradient_whatever_they_hold(kind: str) -> None:
    # Padding may hold -inf logprobs and NaN advantages: the loss stays finite and they get zero gradient.
    logprobs = torch.tensor([[math.log(0.5), -math.inf]], dtype=torch.float64, requires_grad=True)
    behaviour = torch.tensor([[math.log(0.5), 0.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, math.nan]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    loss, metrics = policy_loss(logprobs, behaviour, advantages, mask, LossConfig(loss_from(kind)))
    loss.backward()
    assert math.isfinite(loss.item()) and metrics.tokens == 1
    assert (
        logprobs.grad is not None and logprobs.grad[0, 1].item() == 0.0 and logprobs.grad[0, 0].item() != 0.0
    )


def test_a_batch_without_sampled_tokens_has_zero_loss() -> None:
    zeros = torch.zeros((2, 3), dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss(zeros, zeros.detach(), zeros.detach(), zeros.detach(), LossConfig())
    assert loss.item() == 0.0 and metrics.tokens == 0


def test_staleness_histogram_counts_tokens_by_versions_behind() -> None:
    assert staleness_histogram(5, [5, 5, 4, 2, 4]) == {0: 2, 1: 2, 3: 1}
    with pytest.raises(ValueError, match="newer"):
        staleness_histogram(2, [3])
