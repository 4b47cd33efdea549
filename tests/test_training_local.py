"""The local training provider on a tiny random-weight Qwen3 (CPU, fp32): a step moves the policy the way the
advantage says, micro-batching leaves the gradient alone, checkpoints resume exactly, a NaN loss changes nothing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rollout.training.batches import Batch, WeightedSegment
from rollout.training.local import LocalTrainer, LocalTrainerConfig, NonFiniteLoss
from rollout.training.losses import LossConfig
from rollout.training.segments import TrainingSegment

LOSS = LossConfig("truncated_is", is_cap=2.0)
CONFIG = LocalTrainerConfig(lora_rank=4, lora_alpha=8, learning_rate=5e-3, max_grad_norm=100.0)


def segment(first: int, length: int = 12, sampled: int = 5) -> TrainingSegment:
    tokens = tuple(range(first, first + length))
    mask = (0,) * (length - sampled) + (1,) * sampled
    return TrainingSegment(
        segment_id=f"s{first}",
        seat="seat",
        tokens_T=tokens,
        mask_T=mask,
        behaviour_logprobs_T=(0.0,) * length,
        versions_T=(0,) * length,
    )


def on_policy(trainer: LocalTrainer, weighted: list[WeightedSegment]) -> Batch:
    """The segments with behaviour logprobs set to the trainer's own (as if it had just sampled them)."""
    with torch.no_grad():
        logprobs, _ = trainer.token_logprobs(weighted)
    rebuilt = []
    for row, w in enumerate(weighted):
        s = w.segment
        behaviour = (0.0, *logprobs[row, : len(s.tokens_T) - 1].tolist())
        behaviour = tuple(b if m else 0.0 for b, m in zip(behaviour, s.mask_T, strict=True))
        rebuilt.append(
            WeightedSegment(
                episode=w.episode,
                agent=w.agent,
                advantage=w.advantage,
                segment=TrainingSegment(
                    segment_id=s.segment_id,
                    seat=s.seat,
                    tokens_T=s.tokens_T,
                    mask_T=s.mask_T,
                    behaviour_logprobs_T=behaviour,
                    versions_T=s.versions_T,
                ),
            )
        )
    tokens = sum(w.segment.sampled_tokens for w in rebuilt)
    return Batch(
        policy="default",
        segments=tuple(rebuilt),
        episodes=tuple(w.episode for w in rebuilt),
        skipped_groups=0,
        reward_mean=0.0,
        reward_std=0.0,
        sampled_tokens=tokens,
    )


def sampled_logprob(trainer: LocalTrainer, weighted: WeightedSegment) -> float:
    with torch.no_grad():
        logprobs, aligned = trainer.token_logprobs([weighted])
    return float((logprobs * aligned["mask"]).sum())


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_a_step_moves_the_sampled_tokens_the_way_the_advantage_says(
    tiny_qwen3: str, advantage: float
) -> None:
    trainer = LocalTrainer(tiny_qwen3, CONFIG, LOSS)
    weighted = WeightedSegment(episode="e", agent="solver", advantage=advantage, segment=segment(100))
    before = sampled_logprob(trainer, weighted)
    metrics = trainer.step(on_policy(trainer, [weighted]))
    after = sampled_logprob(trainer, weighted)
    assert (after - before) * advantage > 0, (before, after)
    assert metrics["tokens"] == 5 and metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["step"] == 1 and math.isfinite(metrics["grad_norm"])


def test_micro_batches_do_not_change_the_step(tiny_qwen3: str) -> None:
    whole = LocalTrainer(tiny_qwen3, CONFIG, LOSS)
    pieces = LocalTrainer(
        tiny_qwen3, LocalTrainerConfig(**{**CONFIG.__dict__, "micro_batch_tokens": 12}), LOSS
    )
    segments = [
        WeightedSegment(episode="a", agent="x", advantage=1.0, segment=segment(10)),
        WeightedSegment(episode="b", agent="x", advantage=-0.5, segment=segment(40, 9, 3)),
        WeightedSegment(episode="c", agent="x", advantage=2.0, segment=segment(70, 12, 7)),
    ]
    batch = on_policy(whole, segments)
    whole.step(batch)
    pieces.step(batch)
    for a, b in zip(whole.parameters, pieces.parameters, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_checkpoint_resumes_the_weights_and_the_optimiser_exactly(tiny_qwen3: str, tmp_path: Path) -> None:
    first = LocalTrainer(tiny_qwen3, CONFIG, LOSS)
    batch = on_policy(
        first, [WeightedSegment(episode="e", agent="solver", advantage=1.0, segment=segment(200))]
    )
    first.step(batch)
    first.save(tmp_path / "ckpt-1")
    assert (tmp_path / "ckpt-1" / "adapter_config.json").exists(), "a peft adapter directory engines can load"
    continued = first.step(batch)
    resumed = LocalTrainer.resume(tmp_path / "ckpt-1", CONFIG, LOSS)
    assert resumed.steps == 1
    again = resumed.step(batch)
    assert again["step"] == continued["step"] == 2
    assert again["loss"] == pytest.approx(continued["loss"], rel=1e-5)
    for a, b in zip(first.parameters, resumed.parameters, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_non_finite_loss_changes_no_weight(tiny_qwen3: str) -> None:
    trainer = LocalTrainer(tiny_qwen3, CONFIG, LOSS)
    s = segment(300)
    poisoned = TrainingSegment(
        segment_id=s.segment_id,
        seat=s.seat,
        tokens_T=s.tokens_T,
        mask_T=s.mask_T,
        behaviour_logprobs_T=tuple(math.nan if m else 0.0 for m in s.mask_T),
        versions_T=s.versions_T,
    )
    before = [p.detach().clone() for p in trainer.parameters]
    with pytest.raises(NonFiniteLoss, match="no weights were changed"):
        trainer.step(
            Batch(
                policy="default",
                segments=(WeightedSegment(episode="e", agent="x", advantage=1.0, segment=poisoned),),
                episodes=("e",),
                skipped_groups=0,
                reward_mean=0.0,
                reward_std=0.0,
                sampled_tokens=5,
            )
        )
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.parameters, strict=True))
    assert trainer.steps == 0


def test_full_weights_train_too(tiny_qwen3: str, tmp_path: Path) -> None:
    full = LocalTrainerConfig(lora_rank=None, learning_rate=1e-3)
    trainer = LocalTrainer(tiny_qwen3, full, LOSS)
    weighted = WeightedSegment(episode="e", agent="solver", advantage=1.0, segment=segment(500))
    before = sampled_logprob(trainer, weighted)
    trainer.step(on_policy(trainer, [weighted]))
    assert sampled_logprob(trainer, weighted) > before
    trainer.save(tmp_path / "full")
    assert (tmp_path / "full" / "config.json").exists() and (tmp_path / "full" / "optimizer.pt").exists()
    resumed = LocalTrainer.resume(tmp_path / "full", full, LOSS)
    assert resumed.steps == 1 and sampled_logprob(resumed, weighted) == pytest.approx(
        sampled_logprob(trainer, weighted)
    )


def test_logprobs_are_computed_only_where_sampled_tokens_are_and_match_the_full_forward(
    tiny_qwen3: str,
) -> None:
    trainer = LocalTrainer(tiny_qwen3, CONFIG, LOSS)
    weighted = [
        WeightedSegment(episode="e", agent="solver", advantage=1.0, segment=segment(100)),
        WeightedSegment(episode="f", agent="solver", advantage=1.0, segment=segment(300, length=9)),
    ]
    with torch.no_grad():
        logprobs, aligned = trainer.token_logprobs(weighted)
        tokens = torch.zeros((2, logprobs.shape[1] + 1), dtype=torch.long)
        attention = torch.zeros_like(tokens)
        for row, w in enumerate(weighted):
            tokens[row, : len(w.segment.tokens_T)] = torch.tensor(w.segment.tokens_T)
            attention[row, : len(w.segment.tokens_T)] = 1
        full = trainer.model(input_ids=tokens, attention_mask=attention).logits[:, :-1].float()
        expected = torch.log_softmax(full, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    sampled = aligned["mask"] > 0
    assert sampled.sum() > 0
    assert torch.allclose(logprobs[sampled], expected[sampled], atol=1e-5)
    unused = ~sampled.any(dim=0)  # positions where no row predicts a sampled token
    assert unused.any() and (logprobs[:, unused] == 0).all(), "no logits where no sampled token is predicted"


@pytest.mark.parametrize(
    ("quantization", "lora_rank", "refusal"),
    [("nf4", 8, "needs a CUDA GPU"), ("nf4", None, "set trainer.lora_rank"), ("int3", 8, "must be nf4")],
)
def test_a_quantized_trainer_is_refused_where_it_cannot_run(
    tiny_qwen3: str, quantization: str, lora_rank: int | None, refusal: str
) -> None:
    config = LocalTrainerConfig(lora_rank=lora_rank, device="cpu", quantization=quantization)
    with pytest.raises(ValueError, match=refusal):
        LocalTrainer(tiny_qwen3, config, LossConfig("ppo"))
