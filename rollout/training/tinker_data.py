"""A batch as Tinker's training data: one datum per segment, in Tinker's next-token alignment. Pure.

Contract:
- A segment's tokens `tokens_T` become `model_input_T = tokens_T[:-1]` and `target_tokens_T = tokens_T[1:]`:
  position i of the input predicts target i. `logprobs_T` (the sampler's, what Tinker calls the sampling
  logprobs) and `advantages_T` are aligned with the targets.
- Only sampled tokens carry loss: a target that is a prompt, tool or environment token gets advantage 0
  (Tinker's policy losses are sums of per-token terms times the advantage, so it contributes nothing and gets
  no gradient) and logprob 0.
- Tinker sums its losses over tokens and datums; rollout normalises by the batch's sampled tokens
  (docs/rl-math.md), so each advantage is divided by `batch.sampled_tokens`: Tinker's sum is then rollout's
  token mean.
- `loss_function` maps rollout's loss onto the Tinker built-in loss it names (`PolicyLoss.tinker`): `ppo` →
  `ppo` (clip thresholds 1 − clip_low and 1 + clip_high), `cispo` → `cispo`, `truncated_is` →
  `importance_sampling` (Tinker applies no cap: the trainer reports the ratios it saw); a loss with none is
  refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout.rl.batches import Batch
from rollout.rl.losses import LossConfig
from rollout.rl.losses.registry import on_tinker


@dataclass(frozen=True)
class TinkerDatum:
    model_input_T: tuple[int, ...]
    target_tokens_T: tuple[int, ...]
    logprobs_T: tuple[float, ...]
    advantages_T: tuple[float, ...]
    mask_T: tuple[int, ...]  # 1 where the target was sampled


def tinker_datums(batch: Batch) -> list[TinkerDatum]:
    normaliser = max(batch.sampled_tokens, 1)
    datums = []
    for weighted in batch.segments:
        s = weighted.segment
        if len(s.tokens_T) < 2 or not any(s.mask_T[1:]):
            continue  # nothing sampled to predict
        mask = tuple(int(m) for m in s.mask_T[1:])
        advantage = weighted.advantage / normaliser
        datums.append(
            TinkerDatum(
                model_input_T=tuple(s.tokens_T[:-1]),
                target_tokens_T=tuple(s.tokens_T[1:]),
                logprobs_T=tuple(
                    float(lp) if m else 0.0 for lp, m in zip(s.behaviour_logprobs_T[1:], mask, strict=True)
                ),
                advantages_T=tuple(advantage if m else 0.0 for m in mask),
                mask_T=mask,
            )
        )
    return datums


def loss_function(config: LossConfig) -> tuple[str, dict[str, float]]:
    """Tinker's loss name and its `loss_fn_config` for rollout's loss (refused when Tinker has none like
    it)."""
    if config.loss.tinker is None:
        raise ValueError(f"Tinker has no loss like {config.loss.name}: choose {on_tinker()}")
    return config.loss.tinker, config.loss.tinker_config()
