"""Prefix-shared training: a prefix several segments share is computed once, and the step (its loss, its
gradients, the statistics it records) equals the unshared step's in fp32, for every loss, on tiny-qwen3 and
SmolLM2."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, MistralConfig, Qwen3Config, Qwen3NextConfig

from rollout.engines.models import SMOLLM2, resolve
from rollout.rl.batches import Batch, WeightedSegment
from rollout.rl.losses import CISPO, PPO, LossConfig, TruncatedIS
from rollout.rl.segments import TrainingSegment
from rollout.training import logprobs
from rollout.training.local import LocalTrainer, LocalTrainerConfig, _shard
from rollout.training.logprobs import Layout, Rows, layout_for, micro_batches
from rollout.training.prefix_tree import PrefixForest

CONFIG = LocalTrainerConfig(lora_rank=4, lora_alpha=8, learning_rate=1e-3, max_grad_norm=1e6, device="cpu")
LOSSES = {
    "truncated_is": LossConfig(TruncatedIS(is_cap=1.5)),
    "ppo": LossConfig(PPO()),
    "cispo": LossConfig(CISPO()),
    "ppo with IcePop": LossConfig(PPO(), token_mask_bounds=(0.5, 2.0)),
}


def ids(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(100, 40_000) for _ in range(count)]


def segment(
    name: str, rng: random.Random, prompt: list[int], sampled: list[int], earlier: Sequence[int] = ()
) -> TrainingSegment:
    """`earlier` (sampled in an earlier turn, trained) + `prompt` (not trained) + `sampled` (trained), with
    behaviour logprobs off the policy's, so ratios leave 1 and the losses clip and mask."""
    tokens = [*earlier, *prompt, *sampled]
    mask = [1] * len(earlier) + [0] * len(prompt) + [1] * len(sampled)
    mask[0] = 0
    behaviour = [-rng.uniform(5.0, 14.0) if m else 0.0 for m in mask]
    return TrainingSegment(
        segment_id=name,
        seat="seat",
        tokens_T=tuple(tokens),
        mask_T=tuple(mask),
        behaviour_logprobs_T=tuple(behaviour),
        versions_T=(0,) * len(tokens),
    )


def group_of_eight(rng: random.Random) -> list[WeightedSegment]:
    """Eight answers to one prompt: two identical, two sharing their first tokens."""
    prompt = ids(rng, 40)
    answers = [ids(rng, 10) for _ in range(6)]
    answers += [answers[0], [*answers[1][:4], *ids(rng, 6)]]
    return [
        WeightedSegment(f"e{n}", "solver", rng.uniform(-1.5, 1.5), segment(f"s{n}", rng, prompt, answer))
        for n, answer in enumerate(answers)
    ]


def rewritten_conversation(rng: random.Random) -> list[WeightedSegment]:
    """A conversation split in two segments by a rewrite: the second keeps the opening and the first answer,
    then its history differs (a compacted second turn) and it goes on."""
    opening, first_answer = ids(rng, 30), ids(rng, 12)
    second_turn, second_answer = ids(rng, 20), ids(rng, 12)
    compacted, third_answer = ids(rng, 8), ids(rng, 15)
    before = segment(
        "before", rng, [*opening, *first_answer, *second_turn], second_answer
    )  # first answer as prompt here, for brevity: the second segment trains it
    after = segment("after", rng, compacted, third_answer, earlier=[*opening, *first_answer])
    return [WeightedSegment("e", "coder", 0.8, before), WeightedSegment("e", "coder", 0.8, after)]


def two_seats(rng: random.Random) -> list[WeightedSegment]:
    """A two-seat episode whose seats share a system prompt, each with its own advantage."""
    system = ids(rng, 35)
    return [
        WeightedSegment("e", "red", 1.0, segment("red", rng, [*system, *ids(rng, 10)], ids(rng, 14))),
        WeightedSegment("e", "blue", -1.0, segment("blue", rng, [*system, *ids(rng, 6)], ids(rng, 9))),
    ]


CASES = {"group": group_of_eight, "rewrite": rewritten_conversation, "two seats": two_seats}


def stepped(model: str, layout: Layout, loss: LossConfig, batch: Batch, config: LocalTrainerConfig) -> Any:
    trainer = LocalTrainer(model, config, loss)
    trainer.layout = layout
    metrics = trainer.step(batch)
    return metrics, [p.grad.clone() for p in trainer.parameters]


@pytest.fixture(scope="module")
def smollm2(models_dir: Any) -> str:
    return resolve(SMOLLM2, models_dir)


def assert_same_step(shared: Any, unshared: Any) -> None:
    (metrics, grads), (metrics_u, grads_u) = shared, unshared
    assert metrics["computed_tokens"] < metrics["segment_tokens"] <= metrics_u["computed_tokens"]
    # What sharing changes, and what a wall time divides.
    for key in metrics.keys() - {"computed_tokens", "train_s", "model_tflops_per_s"}:
        assert metrics[key] == pytest.approx(metrics_u[key], rel=1e-4, abs=1e-5), key
    assert len(grads) == len(grads_u) > 0
    for got, expected in zip(grads, grads_u, strict=True):
        assert torch.allclose(got, expected, rtol=1e-3, atol=1e-6), (got - expected).abs().max()


def all_cases(rng: random.Random) -> list[WeightedSegment]:
    """The three cases in one batch: each shares within itself, never with another (their ids differ)."""
    return [w for case in CASES.values() for w in case(rng)]


@pytest.mark.parametrize("loss", LOSSES)
def test_a_shared_step_equals_the_unshared_one_on_tiny_qwen3(tiny_qwen3: str, loss: str) -> None:
    batch = Batch.of("default", all_cases(random.Random(7)))
    config = replace(CONFIG, updates_per_batch=2)  # the second update reads π_old from the first's pass
    shared = stepped(tiny_qwen3, Layout.tree, LOSSES[loss], batch, config)
    assert_same_step(shared, stepped(tiny_qwen3, Layout.packed, LOSSES[loss], batch, config))


def test_a_shared_step_equals_the_unshared_one_on_smollm2(smollm2: str) -> None:
    rng = random.Random(11)
    batch = Batch.of("default", all_cases(rng))
    shared = stepped(smollm2, Layout.tree, LOSSES["ppo"], batch, CONFIG)
    assert_same_step(shared, stepped(smollm2, Layout.padded, LOSSES["ppo"], batch, CONFIG))


def test_a_group_computes_its_prompt_once_and_the_budget_counts_what_is_computed() -> None:
    segments = group_of_eight(random.Random(3))  # a 40-token prompt, 8 answers of 10 (one twice, one half)
    rows = Rows.build(segments, layout=Layout.tree)
    assert rows.computed_tokens == 40 + 6 * 10 + 0 + 6
    assert len(rows.target_N) == sum(w.segment.sampled_tokens for w in segments), "every prediction kept"
    assert [len(micro) for micro in micro_batches(segments, 106, layout=Layout.tree)] == [8]
    assert [len(m) for m in micro_batches(segments, 106, layout=Layout.packed)] == [2, 2, 2, 2]
    assert sum(len(m) for m in micro_batches(segments, 60, layout=Layout.tree)) == 8


def test_each_token_sees_only_its_own_segment() -> None:
    forest = PrefixForest()
    assert forest.add([1, 2, 3]) == [0, 1, 2]
    assert forest.add([1, 2, 4, 5]) == [0, 1, 3, 4]
    assert forest.add([1, 2]) == [0, 1] and forest.cost([1, 2, 3]) == 0 and forest.cost([9]) == 1
    assert forest.add([9, 2]) == [5, 6]
    assert forest.positions == [0, 1, 2, 2, 3, 0, 1]
    visible = forest.visible()
    expected = {0: {0}, 1: {0, 1}, 2: {0, 1, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {5}, 6: {5, 6}}
    assert {i: set(visible[i].nonzero().flatten().tolist()) for i in range(7)} == expected


@pytest.mark.parametrize(
    ("config", "layout", "why"),
    [
        (LlamaConfig(), Layout.tree, None),
        (Qwen3Config(), Layout.tree, None),
        (MistralConfig(sliding_window=None), Layout.tree, None),
        (MistralConfig(sliding_window=4096), Layout.packed, "sliding window"),
        (Qwen3Config(use_sliding_window=True, max_window_layers=0), Layout.packed, "sliding window"),
        (Qwen3NextConfig(), Layout.padded, "linear attention"),
    ],
)
def test_models_whose_layers_cannot_share_fall_back_and_say_why(
    config: Any, layout: Layout, why: str | None
) -> None:
    got, reason = layout_for(config)
    assert got is layout
    assert (reason is None) if why is None else (why in (reason or ""))


def test_a_trainer_that_cannot_share_says_so_once(
    tiny_qwen3: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logprobs, "PACKABLE", logprobs.PACKABLE - {"qwen3"})  # as if it had linear attention
    with caplog.at_level("WARNING", logger="rollout.training.local"):
        trainer = LocalTrainer(tiny_qwen3, CONFIG, LOSSES["ppo"])
        trainer.step(Batch.of("default", two_seats(random.Random(5))))
        trainer.step(Batch.of("default", two_seats(random.Random(6))))
    said = [r.getMessage() for r in caplog.records if "without shared prefixes" in r.getMessage()]
    assert trainer.layout is Layout.padded and len(said) == 1 and "linear attention" in said[0]


def test_data_parallel_shards_keep_a_groups_answers_together() -> None:
    rng = random.Random(9)
    segments = tuple(group_of_eight(rng) + group_of_eight(rng))  # two prompts, 16 answers
    shards = [_shard(segments, rank, 2) for rank in range(2)]
    assert sorted(id(w) for shard in shards for w in shard) == sorted(id(w) for w in segments)
    assert [len({w.segment.tokens_T[:40] for w in shard}) for shard in shards] == [1, 1], "a prompt per shard"
    assert all(_shard(segments[:1], rank, 2) == (segments[:1] if rank == 0 else ()) for rank in range(2))
