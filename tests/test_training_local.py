"""The local training provider on a tiny random-weight Qwen3 (CPU, fp32): a step moves the policy the way the
advantage says, micro-batching leaves the gradient alone, checkpoints resume exactly, a NaN loss changes
nothing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rollout.rl.batches import Batch, WeightedSegment
from rollout.rl.losses import PPO, LossConfig, TruncatedIS
from rollout.rl.segments import TrainingSegment
from rollout.training import logprobs
from rollout.training.flops import peak_tflops
from rollout.training.local import LocalTrainer, LocalTrainerConfig, NonFiniteLoss
from rollout.training.logprobs import Layout, Rows, micro_batches, sampled_logprobs

LOSS = LossConfig(TruncatedIS(is_cap=2.0))
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


def logprobs_by_segment(trainer: LocalTrainer, weighted: list[WeightedSegment]) -> list[list[float]]:
    """The trainer's logprob of each sampled token (after the first position), segment by segment."""
    with torch.no_grad():
        flat = sampled_logprobs(
            trainer.model, Rows.build(weighted, layout=trainer.layout)
        ).logprobs_N.tolist()
    by_segment, start = [], 0
    for w in weighted:
        count = sum(w.segment.mask_T[1:])
        by_segment.append(flat[start : start + count])
        start += count
    assert start == len(flat)
    return by_segment


def on_policy(trainer: LocalTrainer, weighted: list[WeightedSegment]) -> Batch:
    """The segments with behaviour logprobs set to the trainer's own (as if it had just sampled them)."""
    rebuilt = []
    for w, own in zip(weighted, logprobs_by_segment(trainer, weighted), strict=True):
        s = w.segment
        sampled = iter(own)
        behaviour = (0.0, *(next(sampled) if m else 0.0 for m in s.mask_T[1:]))
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
    return Batch.of("default", rebuilt)


def sampled_logprob(trainer: LocalTrainer, weighted: WeightedSegment) -> float:
    return sum(logprobs_by_segment(trainer, [weighted])[0])


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
    # The model FLOPs the step computed per second (4N + 2N_trainable a token); a CPU's peak is unknown.
    total = sum(p.numel() for p in trainer.model.parameters())
    trainable = sum(p.numel() for p in trainer.parameters)
    assert trainer.flops_per_token == 4 * total + 2 * trainable and trainable < total / 10, "LoRA: about 4N"
    expected = trainer.flops_per_token * metrics["computed_tokens"] / metrics["train_s"] / 1e12
    assert metrics["model_tflops_per_s"] == pytest.approx(expected) and "mfu" not in metrics


@pytest.mark.parametrize(
    ("device", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-40GB", 312.0),
        ("cpu", None),
    ],
)
def test_a_gpus_peak_is_known_by_its_name(device: str, peak: float | None) -> None:
    assert peak_tflops(device) == peak


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
    # AdamW's first step moves each weight by about the learning rate times its gradient's sign, so a gradient
    # within rounding of 0 may step either way; its first moment is linear in the gradient, and is what must
    # match. (LoRA's A matrices have no gradient on the first step: their B matrices start at 0.)
    moved = 0.0
    for a, b in zip(whole.parameters, pieces.parameters, strict=True):
        moment_a, moment_b = whole.optimizer.state[a]["exp_avg"], pieces.optimizer.state[b]["exp_avg"]
        moved = max(moved, float(moment_a.abs().max()))
        assert torch.allclose(moment_a, moment_b, rtol=1e-3, atol=1e-7)
    assert moved > 0, "the step had a gradient to compare"


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


def full_forward_logprobs(
    trainer: LocalTrainer, weighted: list[WeightedSegment]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: each segment alone through the model's own forward, log-softmax over every position;
    the sampled tokens' logprobs, and the entropy of the distribution each was drawn from."""
    expected, entropies = [], []
    for w in weighted:
        tokens = torch.tensor([w.segment.tokens_T])
        full = torch.log_softmax(trainer.model(input_ids=tokens).logits[0, :-1].float(), dim=-1)
        sampled = torch.tensor(w.segment.mask_T[1:]) > 0
        expected.append(full.gather(-1, tokens[0, 1:, None]).squeeze(-1)[sampled])
        entropies.append(-(full.exp() * full).sum(-1)[sampled].detach())
    return torch.cat(expected), torch.cat(entropies)


@pytest.mark.parametrize("path", ["tree", "packed", "padded", "chunked", "model's own head"])
def test_sampled_logprobs_and_their_gradients_match_each_segment_alone_through_the_full_forward(
    tiny_qwen3: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = LocalTrainer(tiny_qwen3, CONFIG, LOSS)
    assert trainer.layout is Layout.tree, "Qwen3 shares prefixes: full attention is its only mixing"
    if path == "chunked":
        monkeypatch.setattr(logprobs, "CHUNK", 3)  # recomputed in backward, chunk by chunk
    if path == "model's own head":  # as for a soft-capped head: the model's forward, logits_to_keep
        monkeypatch.setattr(logprobs, "LOGIT_TRANSFORMS", ("hidden_size",))
    weighted = [
        WeightedSegment(episode="e", agent="solver", advantage=1.0, segment=segment(100)),
        WeightedSegment(episode="f", agent="solver", advantage=1.0, segment=segment(300, length=9)),
        WeightedSegment(
            episode="g", agent="solver", advantage=1.0, segment=segment(700, length=20, sampled=11)
        ),
    ]
    layout = Layout.packed if path == "packed" else Layout.padded if path == "padded" else Layout.tree
    rows = Rows.build(weighted, layout=layout)
    assert rows.input_ids_RL.shape == ((1, 41) if path != "padded" else (3, 20)), (
        "packed or a tree of segments sharing nothing: one row, no padding"
    )
    scores = sampled_logprobs(trainer.model, rows)
    got = scores.logprobs_N
    got.sum().backward()
    got_grads = [p.grad.clone() for p in trainer.parameters if p.grad is not None]
    trainer.model.zero_grad()
    expected, entropy = full_forward_logprobs(trainer, weighted)
    expected.sum().backward()
    assert len(got) == 5 + 5 + 11 and torch.allclose(got, expected, atol=1e-5)
    assert not scores.entropy_N.requires_grad and torch.allclose(scores.entropy_N, entropy, atol=1e-4)
    assert entropy.min() > 0
    expected_grads = [p.grad for p in trainer.parameters if p.grad is not None]
    assert len(got_grads) == len(expected_grads) > 0
    assert all(
        torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(got_grads, expected_grads, strict=True)
    )


def test_packed_micro_batches_fill_rows_up_to_the_budget() -> None:
    weighted = [
        WeightedSegment(episode=str(n), agent="x", advantage=1.0, segment=segment(10 * n, length))
        for n, length in enumerate([10, 10, 30, 5, 50])
    ]
    lengths = [
        [len(w.segment.tokens_T) for w in micro]
        for micro in micro_batches(weighted, 25, layout=Layout.packed)
    ]
    assert lengths == [[10, 10], [30], [5], [50]], "a segment longer than the budget gets a row of its own"
    padded = [
        [len(w.segment.tokens_T) for w in micro]
        for micro in micro_batches(weighted, 25, layout=Layout.padded)
    ]
    assert padded == [[10, 10], [30], [5], [50]]
    assert micro_batches(weighted[:2] + weighted[3:4], 25, layout=Layout.packed) == [
        weighted[:2] + weighted[3:4]
    ]


@pytest.mark.parametrize(
    ("quantization", "lora_rank", "refusal"),
    [("nf4", 8, "needs a CUDA GPU"), ("nf4", None, "set trainer.lora_rank"), ("int3", 8, "must be nf4")],
)
def test_a_quantized_trainer_is_refused_where_it_cannot_run(
    tiny_qwen3: str, quantization: str, lora_rank: int | None, refusal: str
) -> None:
    config = LocalTrainerConfig(lora_rank=lora_rank, device="cpu", quantization=quantization)
    with pytest.raises(ValueError, match=refusal):
        LocalTrainer(tiny_qwen3, config, LossConfig(PPO()))


def test_several_updates_per_batch_let_ppos_clip_hold_the_policy_back(tiny_qwen3: str) -> None:
    """From the second update on, PPO's ratio π_θ/π_old leaves 1 and its clip stops the tokens that moved far
    enough; unclipped importance sampling keeps pushing them."""
    weighted = [WeightedSegment(episode="e", agent="solver", advantage=1.0, segment=segment(300, 12, 8))]
    moved: dict[str, float] = {}
    for name, loss in (("ppo", LossConfig(PPO())), ("is", LossConfig(TruncatedIS(is_cap=1e9)))):
        config = LocalTrainerConfig(**{**CONFIG.__dict__, "updates_per_batch": 6})
        trainer = LocalTrainer(tiny_qwen3, config, loss)
        batch = on_policy(trainer, weighted)
        before = sampled_logprob(trainer, weighted[0])
        metrics = trainer.step(batch)
        moved[name] = sampled_logprob(trainer, weighted[0]) - before
        assert metrics["step"] == 1 and trainer.steps == 1, "a step counts batches, not updates"
        assert metrics["updates"] == 6 and metrics["ratio_max"] > 1.0
        if name == "ppo":
            assert metrics["clipped_fraction"] > 0, "the clip never acted"
    assert moved["is"] > moved["ppo"] > 0, moved
    with pytest.raises(ValueError, match="1 or more"):
        LocalTrainerConfig(updates_per_batch=0)
