"""Training segments rebuilt from recorded turns, and batches assembled from finished episodes."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from gridworld.environment import environment as gridworld
from gridworld.policy import reply_to_prompt
from rollout.activities.agent_loop import GatewayChat, play
from rollout.engines.scripted import ScriptedEngine
from rollout.gateway.seats import open_seat, seat_token
from rollout.harness import RunContext
from rollout.ledger import Kind, Ledger
from rollout.ledger.payloads import SampledTurn
from rollout.ledger.streams import seat_stream
from rollout.rendering import ModelRenderer
from rollout.rl.batches import AgentEpisode, assemble_batch
from rollout.rl.segments import TrainingSegment, segments_from_turns
from rollout.rl.selection import EpisodeRecordView, Selection, ready_groups, select_groups, supply_allowance
from tests.gatewayutil import serve_gateway


def turn(segment: str, prefix: int, delta: list[int], completion: list[int], version: int) -> SampledTurn:
    """A recorded turn; only the fields segments are built from matter here."""
    return SampledTurn(
        seat="s",
        run=None,
        episode=None,
        agent="a",
        policy="default",
        turn_index=0,
        fingerprint="f",
        segment_id=segment,
        prompt_prefix_len=prefix,
        prompt_ids_delta=tuple(delta),
        completion_ids=tuple(completion),
        completion_logprobs=tuple(-0.1 * (i + 1) for i in range(len(completion))),
        checkpoint="base",
        checkpoint_version=version,
        engine="e",
        admitted_newest=0,
        admitted_max_lag=0,
        finish_reason="stop",
        stop_sequence=None,
        reply={"role": "assistant", "content": ""},
        parse_failures=(),
        n_messages=1,
        messages_sha="m",
        tools_sha="t",
    )


def test_a_recorded_turn_has_one_logprob_per_sampled_token() -> None:
    """Made by the gateway or read back from the ledger, a turn whose ids and logprobs differ in number is no
    turn: it would train tokens without their behaviour logprob."""
    good = turn("one", 0, [1, 2], [3, 4], version=0)
    assert SampledTurn.from_payload(good.to_payload()) == good
    with pytest.raises(ValueError, match="every sampled token needs its behaviour logprob"):
        replace(good, completion_logprobs=(-0.1,))
    with pytest.raises(ValueError, match="2 completion ids but 3 logprobs"):
        SampledTurn.from_payload({**good.to_payload(), "completion_logprobs": [-0.1, -0.2, -0.3]})


def test_a_batch_says_what_share_of_its_prompts_the_engines_prefix_caches_held() -> None:
    """Each step's metrics carry the batch's hit rate, and the live line of `rollout train` the run's (over
    every batch, skipped or trained); a cached count that is no count of the prompt's tokens is refused where
    the turn is read."""
    from rollout.activities.training import prefix_cache_metrics
    from rollout.control.progress import TrainingProgress
    from rollout.rl.batches import Batch, WeightedSegment

    turns = [
        turn("one", 0, [1, 2, 3, 4], [5, 6], version=0),  # 4 prompt tokens, none cached
        replace(turn("one", 6, [7, 8], [9], version=0), cached_tokens=5),  # 8 prompt tokens, 5 cached
    ]
    (one,) = segments_from_turns(turns)
    assert (one.prompt_tokens, one.cached_tokens) == (12, 5)
    batch = Batch(
        policy="default",
        segments=(WeightedSegment("e", "a", 1.0, one),),
        episodes=("e",),
        skipped_groups=0,
        reward_mean=1.0,
        reward_std=0.0,
        sampled_tokens=3,
    )
    assert prefix_cache_metrics(batch) == {"prefix_cache_hit_rate": pytest.approx(5 / 12)}
    progress = TrainingProgress(run="r", policy="default", episodes=8, prompt_tokens=1000, cached_tokens=875)
    assert (
        progress.line() == "waiting for the first batch · 8 episodes played · cache 88%"
    )  # skipped batches too
    with pytest.raises(ValueError, match="cached_tokens 9 is not a count of the prompt's tokens"):
        replace(turns[1], cached_tokens=9)


def test_turns_chain_into_segments_with_masks_logprobs_and_versions() -> None:
    turns = [
        turn("one", 0, [1, 2, 3], [4, 5], version=0),
        replace(turn("one", 5, [99], [98], version=0), aborted="client went away"),
        turn("one", 5, [6], [7], version=1),
        turn("two", 0, [9], [10], version=1),
    ]
    one, two = segments_from_turns(turns)
    assert one.tokens_T == (1, 2, 3, 4, 5, 6, 7)
    assert one.mask_T == (0, 0, 0, 1, 1, 0, 1)
    assert one.behaviour_logprobs_T == pytest.approx((0, 0, 0, -0.1, -0.2, 0, -0.1))
    assert one.versions_T == (-1, -1, -1, 0, 0, -1, 1), "each token keeps the checkpoint that sampled it"
    assert two.tokens_T == (9, 10) and two.sampled_tokens == 1


def test_ids_a_later_turn_did_not_keep_are_not_trained() -> None:
    (segment,) = segments_from_turns([turn("s", 0, [1, 2], [3, 4, 5], 0), turn("s", 4, [6], [7], 0)])
    assert segment.tokens_T == (1, 2, 3, 4, 6, 7) and segment.mask_T == (0, 0, 1, 1, 0, 1)
    with pytest.raises(ValueError, match="recording order"):
        segments_from_turns([turn("s", 3, [1], [2], 0)])


def segment(tokens: int) -> TrainingSegment:
    return TrainingSegment(
        segment_id="x",
        seat="s",
        tokens_T=tuple(range(tokens)),
        mask_T=(1,) * tokens,
        behaviour_logprobs_T=(0.0,) * tokens,
        versions_T=(0,) * tokens,
    )


def test_a_batch_gives_each_agent_its_group_advantage_and_skips_groups_without_signal() -> None:
    played = [
        AgentEpisode(
            episode="g0-0", group=0, agent="A", policy="default", reward=1.0, segments=(segment(3),)
        ),
        AgentEpisode(
            episode="g0-1", group=0, agent="A", policy="default", reward=0.0, segments=(segment(2),)
        ),
        AgentEpisode(
            episode="g0-0", group=0, agent="B", policy="default", reward=0.5, segments=(segment(4),)
        ),  # B's group: all 0.5, no signal
        AgentEpisode(
            episode="g0-1", group=0, agent="B", policy="default", reward=0.5, segments=(segment(4),)
        ),
        AgentEpisode(
            episode="g0-0", group=0, agent="judge", policy="frozen", reward=1.0, segments=(segment(9),)
        ),  # another policy: not in this batch
    ]
    batch = assemble_batch(played, "default", "leave_one_out")
    assert [(w.episode, w.agent, w.advantage) for w in batch.segments] == [
        ("g0-0", "A", 1.0),
        ("g0-1", "A", -1.0),
    ]
    assert batch.skipped_groups == 1 and batch.sampled_tokens == 5
    assert batch.episodes == ("g0-0", "g0-1"), "every episode consumed is listed, trained or skipped"
    assert batch.reward_mean == pytest.approx(0.5)


async def test_segments_rebuilt_from_a_real_multi_turn_episode_are_the_tokens_the_model_saw(
    ledger: Ledger, tiny_qwen3: str
) -> None:
    renderer = ModelRenderer(AutoTokenizer.from_pretrained(tiny_qwen3), "qwen3")
    secret = b"t" * 32
    async with serve_gateway(ledger, renderer, ScriptedEngine(renderer, reply_to_prompt)) as gateway:
        seat = f"batch-{uuid.uuid4().hex[:8]}"
        await open_seat(ledger, secret, seat_id=seat, agent="solver", policy="default")
        token = seat_token(secret, seat)
        model = GatewayChat(f"{gateway.url}/s/{token}/v1", token)
        parameters = gridworld.source.parameters(0)
        outcome = await play(
            gridworld.make_task(parameters, "solver"),
            RunContext(run="r", episode="e", seat=seat, attempt=1, parameters=parameters),
            model,
            max_turns=gridworld.max_turns,
        )
        await model.close()
    turns = [e.payload for e in await ledger.read(seat_stream(seat)) if e.kind == Kind.TURN_RECORDED]
    assert outcome.turns == len(turns) == 10
    (one,) = segments_from_turns(SampledTurn.from_payload(t) for t in turns)  # the loop extends one segment
    last = turns[-1]
    assert one.tokens_T[: len(one.tokens_T) - len(last["completion_ids"])][
        -len(last["prompt_ids_delta"]) :
    ] == tuple(last["prompt_ids_delta"])
    assert one.sampled_tokens == sum(len(t["completion_ids"]) for t in turns)
    assert [one.tokens_T[i] for i, m in enumerate(one.mask_T) if m] == [
        i for t in turns for i in t["completion_ids"]
    ]
    assert last["prompt_prefix_len"] + len(last["prompt_ids_delta"]) + len(last["completion_ids"]) == len(
        one.tokens_T
    )


def _views(groups: dict[int, int]) -> list[EpisodeRecordView]:
    return [EpisodeRecordView(f"g{g}-{m}", g, True) for g, n in groups.items() for m in range(n)]


def test_a_step_takes_a_whole_batch_of_the_oldest_ready_groups_or_waits() -> None:
    views = _views({0: 4, 1: 3, 2: 4, 3: 4})
    assert ready_groups(views, group_size=4, consumed=set(), groups_per_batch=2) == [0, 2]
    assert ready_groups(views, group_size=4, consumed={0}, groups_per_batch=2) == [2, 3]
    assert ready_groups(views, group_size=4, consumed={0, 2}, groups_per_batch=2) == [], "one ready: wait"
    assert ready_groups(views, group_size=4, consumed={0, 2}, groups_per_batch=1) == [3]
    failed = [*views, *(EpisodeRecordView(f"g4-{m}", 4, False) for m in range(4))]
    half = [
        *failed,
        EpisodeRecordView("g5-0", 5, True),
        *(EpisodeRecordView(f"g5-{m}", 5, False) for m in (1, 2, 3)),
    ]
    assert ready_groups(half, group_size=4, consumed={0, 2, 3}, groups_per_batch=1) == [5], (
        "a group whose every episode failed trains nothing and is never taken; one with a finished episode is"
    )


def test_the_supply_allowance_is_max_lag_plus_one_batches_ahead_of_training() -> None:
    assert supply_allowance(0, 0, 2) == 2, "max_lag 0: one batch, then wait for its step"
    assert supply_allowance(3, 0, 2) == 8
    assert supply_allowance(3, 4, 2) == 16


def _tied_or_not(groups: dict[int, bool], *, size: int = 4, agent: str = "A") -> list[EpisodeRecordView]:
    """Whole groups of `size` finished episodes: True, rewards that differ (signal); False, all equal."""
    return [
        EpisodeRecordView(f"g{g}-{m}", g, True, {agent: float(m % 2) if signal else 0.5})
        for g, signal in groups.items()
        for m in range(size)
    ]


def test_refill_replaces_tied_groups_by_fresh_ones_within_its_bound() -> None:
    """DAPO's dynamic sampling: a step keeps `groups_per_batch` groups that carry signal, consuming the tied
    groups it meets as replaced, at most `refill_max` of them; past the bound a tied group is kept (and
    skipped for no signal, as without refill)."""
    odd_tie = _tied_or_not({g: g % 2 == 0 for g in range(8)})

    def select(
        consumed: set[int], refill_max: int | None, views: list[EpisodeRecordView] = odd_tie
    ) -> Selection:
        return select_groups(
            views, group_size=4, consumed=consumed, groups_per_batch=2, refill_max=refill_max
        )

    assert select(set(), 2) == Selection([0, 2], [1]), (
        "the even groups train, the odd one between is replaced"
    )
    assert select({0, 1, 2}, 2) == Selection([4, 6], [3, 5])
    assert select(set(), None) == Selection([0, 1]), "refill off: the oldest groups, tied or not, as before"
    assert select(set(), 0) == Selection([0, 1]), "a bound of 0 replaces nothing"
    all_tied = _tied_or_not(dict.fromkeys(range(8), False))
    assert select(set(), 3, all_tied) == Selection([3, 4], [0, 1, 2]), (
        "every group ties: the bound is drawn, then the batch is whole of tied groups (skipped for no signal)"
    )
    assert select(set(), 3, all_tied[:16]) == Selection([], [0, 1, 2]), (
        "not whole yet: the step waits, and says how many tied groups it set aside (their replacements may start)"
    )
    assert select(set(), 3, all_tied[:16]).set_aside == 3
    assert select({0, 1, 2}, 2, odd_tie[:20]) == Selection([], [3]), "one signal group of two: wait"
    # Again, the same records: the same selection (a retried step agrees).
    assert select({0, 1, 2}, 2) == select({0, 1, 2}, 2)


def test_a_groups_signal_is_its_trained_agents_rewards_of_finished_episodes() -> None:
    """Another agent's rewards (a pinned rival's: not in the records' rewards, by `agents`) do not count; an
    abandoned episode's reward does not either; one agent with signal is enough."""
    one_finished = [
        EpisodeRecordView("g0-0", 0, True, {"A": 1.0}),
        *(EpisodeRecordView(f"g0-{m}", 0, False) for m in (1, 2, 3)),
    ]
    two_agents = [EpisodeRecordView(f"g0-{m}", 0, True, {"A": 0.5, "B": float(m)}) for m in range(4)]
    assert select_groups(one_finished, group_size=4, consumed=set(), groups_per_batch=1, refill_max=1) == (
        Selection([], [0])
    ), "a single finished episode has no signal"
    assert select_groups(two_agents, group_size=4, consumed=set(), groups_per_batch=1, refill_max=1) == (
        Selection([0])
    )
