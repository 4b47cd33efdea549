"""Self-play pins (rollout.run.pins): a seat pinned relative to its own policy's lineage. The pin's syntax is
checked where the environment is made; the pin resolves per episode from the ledger's served lineage
(falling back, and saying so, while the lineage is short; a restarted episode keeps its opponent; `sample`
draws are reproducible); a real training run plays checkpoint N against N-1 and trains from the trained seat
only; an eval plays both seats on the evaluated checkpoint."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from rollout.activities.batches import load_batch
from rollout.activities.pins import resolve_pins
from rollout.config import Settings
from rollout.environment import AgentSeatSpec, EnvironmentLoadError, load_environment
from rollout.gateway.seats import open_seat
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.payloads import EpisodeEnded, episode_ended
from rollout.ledger.queries import read_all, served_lineage
from rollout.ledger.streams import (
    SERVING_TARGETS,
    policy_checkpoints_stream,
    run_batches_stream,
    run_episodes_stream,
    seat_stream,
)
from rollout.monitor.plain import plain
from rollout.records.batches import BatchInfo
from rollout.records.checkpoints import CheckpointRecord
from rollout.records.serving import ServingTarget
from rollout.run.pins import SAMPLE_WINDOW, RelativePin, parse_pin
from rollout.training.checkpoints import checkpoint_name
from rollout.workflows.episode_types import EnvironmentInfo, PinRequest
from rollout.workflows.evals import eval_seats
from rollout.workflows.names import run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow, trained_policies
from tests.example_envs import coin_selfplay
from tests.test_monitor import view
from tests.test_training_loop import run_input, training_loop

LINEAGE = [f"p-step00000{n}" for n in range(1, 6)]


def test_pins_parse_and_a_malformed_one_fails_where_the_seat_is_made() -> None:
    assert parse_pin("latest") == RelativePin("latest")
    assert parse_pin("latest-3") == RelativePin("latest-3", behind=3)
    assert parse_pin("sample") == RelativePin("sample", window=SAMPLE_WINDOW)
    assert parse_pin("sample-4") == RelativePin("sample-4", window=4)
    assert parse_pin("base") is None and parse_pin("r/default-step000003") is None, "fixed names"
    for bad in ("latest-0x", "latest-0", "latest-", "sample-0", "latest3", "samples"):
        with pytest.raises(ValueError, match="no checkpoint pin: latest, latest-K"):
            parse_pin(bad)
    with pytest.raises(ValueError, match="latest-0x") as raised:
        AgentSeatSpec("rival", checkpoint="latest-0x")
    assert str(raised.value).startswith("agent 'rival': checkpoint 'latest-0x' is no checkpoint pin")
    assert "\n" not in str(raised.value)
    seat = AgentSeatSpec("rival", checkpoint="latest-1")
    assert not seat.trainable and seat.relative_pin == RelativePin("latest-1", behind=1)


def test_a_malformed_pin_stops_the_environment_loading_in_one_line(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "badpin_env.py").write_text(
        "from rollout.environment import AgentSeatSpec, Dataset, Environment\n"
        "environment = Environment('e', lambda p, a: None, Dataset([{}]),"
        " agents=(AgentSeatSpec('me'), AgentSeatSpec('rival', checkpoint='latest-0x')))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvironmentLoadError, match="agent 'rival': checkpoint 'latest-0x' is no checkpoint"):
        load_environment("badpin_env:environment")


def test_a_self_play_environment_trains_its_policy_from_the_trained_seat_only() -> None:
    info = EnvironmentInfo(
        "tests.example_envs:coin_selfplay", "coin-selfplay", list(coin_selfplay.agents), 4, 1, True
    )
    assert trained_policies(info) == ["default"]
    assert [a.trainable for a in coin_selfplay.agents] == [True, False]


def test_an_eval_plays_a_self_play_seat_on_the_evaluated_checkpoint() -> None:
    seats = [*coin_selfplay.agents, AgentSeatSpec("old", checkpoint="base")]
    assert [a.checkpoint for a in eval_seats(seats, "r/default-step000003")] == [
        "r/default-step000003",
        "r/default-step000003",
        "base",
    ], "an eval run has no lineage: the pin plays what is evaluated; a fixed pin stays"


def test_a_pin_picks_from_the_lineage_and_falls_back_saying_so_while_it_is_short() -> None:
    behind = RelativePin("latest-1", behind=1)
    first = behind.choose([], "ep")
    assert first.checkpoint == "base" and first.fallback and "no checkpoint" in first.fallback
    short = behind.choose(LINEAGE[:1], "ep")
    assert short.checkpoint == LINEAGE[0] and short.fallback and "played the oldest" in short.fallback
    assert behind.choose(LINEAGE, "ep") == type(short)(LINEAGE[3])
    assert RelativePin("latest").choose(LINEAGE, "ep").checkpoint == LINEAGE[-1]


def test_sample_draws_are_reproducible_per_episode_and_stay_in_the_window() -> None:
    pin = RelativePin("sample-3", window=3)
    draws = [pin.choose(LINEAGE, f"run/g{n:06d}-0/rival").checkpoint for n in range(40)]
    assert draws == [pin.choose(LINEAGE, f"run/g{n:06d}-0/rival").checkpoint for n in range(40)]
    assert set(draws) == set(LINEAGE[-3:]), "uniform over the newest three"


async def _publish(ledger: Ledger, run: str, policy: str, step: int, *, served: bool = True) -> str:
    name = checkpoint_name(policy, step)
    parent = None if step == 1 else checkpoint_name(policy, step - 1)
    record = CheckpointRecord(name=name, policy=policy, version=step, parent=parent, run=run, files={})
    await ledger.append_one(
        policy_checkpoints_stream(policy),
        NewEvent(f"step/{step}", Kind.CHECKPOINT_CREATED, record.to_payload()),
    )
    if served:
        target = ServingTarget(policy=policy, checkpoint=name, version=step, run=run, format="lora")
        await ledger.append_one(
            SERVING_TARGETS, NewEvent(target.key, Kind.SERVING_TARGET, target.to_payload())
        )
    return name


async def test_pins_resolve_from_the_served_lineage_and_a_restarted_episode_keeps_its_opponent(
    ledger: Ledger,
) -> None:
    run = f"selfplay-{uuid.uuid4().hex[:8]}"
    policy = run_policy(run, "default")
    agents = [AgentSeatSpec("player"), AgentSeatSpec("rival", checkpoint="latest-1")]
    request = PinRequest(run, "g000000-0", agents)
    (early,) = await resolve_pins(ledger, request)
    assert (early.agent, early.pin, early.checkpoint) == ("rival", "latest-1", "base") and early.fallback

    first = await _publish(ledger, run, policy, 1)
    second = await _publish(ledger, run, policy, 2)
    await _publish(ledger, run, policy, 3, served=False)  # no serving target: no engine can play it yet
    assert await served_lineage(ledger, policy) == [first, second]
    (pinned,) = await resolve_pins(ledger, request)
    assert (pinned.checkpoint, pinned.fallback) == (first, None)

    # The episode opens its seat pinned to what it resolved; newer checkpoints arrive; it is restarted.
    await open_seat(
        ledger,
        b"s" * 32,
        seat_id=f"{run}/g000000-0/rival",
        agent="rival",
        policy=policy,
        run=run,
        episode="g000000-0",
        checkpoint=pinned.checkpoint,
    )
    await _publish(ledger, run, policy, 4)
    (again,) = await resolve_pins(ledger, request)
    assert again.checkpoint == first, "a restarted episode plays the same opponent"
    (other,) = await resolve_pins(ledger, PinRequest(run, "g000001-0", agents))
    assert other.checkpoint == checkpoint_name(policy, 2), "a new episode: one behind the newest served (4)"

    sampled = [AgentSeatSpec("rival", checkpoint="sample")]
    draws = [
        (await resolve_pins(ledger, PinRequest(run, f"g{n:06d}-1", sampled)))[0].checkpoint for n in range(6)
    ]
    again_draws = [
        (await resolve_pins(ledger, PinRequest(run, f"g{n:06d}-1", sampled)))[0].checkpoint for n in range(6)
    ]
    assert draws == again_draws and set(draws) <= {first, second, checkpoint_name(policy, 4)}


async def test_a_run_plays_checkpoint_n_against_n_minus_1_and_trains_the_trained_seat_only(
    stack_settings: Settings, ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path) as loop:
        given = run_input(loop, 3)
        given.environment = "tests.example_envs:coin_selfplay"
        await asyncio.wait_for(
            loop.client.execute_workflow(
                RunWorkflow.run, given, id=run_workflow_id(loop.run), task_queue=loop.queue
            ),
            300,
        )
        # Released opponents stay loaded within the engine's budget: each the rival played that is older
        # than the newest two checkpoints (which the engine serves anyway).
        played = await _rivals_played(ledger, loop.run)
        expected = {name for name in played if name != "base" and _version(name) <= 1}
        for _ in range(100):
            if not loop.follower.requests.wanted() and expected <= set(loop.follower.state().opponents):
                break
            await asyncio.sleep(0.1)
        held = loop.follower.state()
        assert expected <= set(held.opponents) and len(held.opponents) <= held.opponent_budget == 4, held
        assert all(_version(name) <= 1 for name in held.opponents), held
    policy = run_policy(loop.run, "default")
    ended = [
        e for event in await read_all(ledger, run_episodes_stream(loop.run)) if (e := episode_ended(event))
    ]
    finished = [e for e in ended if e.finished]
    assert finished and all(set(e.pinned) == {"rival"} for e in finished)
    versus: set[tuple[int, int]] = set()
    for record in finished:
        played = record.pinned["rival"].split(" ")[0]
        rival = await read_all(ledger, seat_stream(record.seats["rival"]))
        (opened,) = [e.payload for e in rival if e.kind == Kind.SEAT_OPENED]
        assert opened["checkpoint"] == played, "the seat opened pinned to what the record names"
        assert {e.payload["checkpoint"] for e in rival if e.kind == Kind.TURN_RECORDED} == {played}
        if played == "base":
            assert "(latest-1:" in record.pinned["rival"], "a fallback says so"
        player = await read_all(ledger, seat_stream(record.seats["player"]))
        for turn in (e.payload for e in player if e.kind == Kind.TURN_RECORDED):
            rival_version = 0 if played == "base" else int(played.rpartition("-step")[2])
            versus.add((turn["checkpoint_version"], rival_version))
    assert any(mine >= 2 and theirs == mine - 1 for mine, theirs in versus), versus

    batches = [
        e
        for e in await read_all(ledger, run_batches_stream(loop.run, policy))
        if e.kind == Kind.BATCH_ASSEMBLED
    ]
    assert batches
    for event in batches:
        batch = await load_batch(ledger, BatchInfo.from_payload(event.payload))
        assert batch.segments and {s.agent for s in batch.segments} == {"player"}


async def _rivals_played(ledger: Ledger, run: str) -> set[str]:
    ended = [e for event in await read_all(ledger, run_episodes_stream(run)) if (e := episode_ended(event))]
    return {e.pinned["rival"].split(" ")[0] for e in ended if "rival" in e.pinned}


def _version(checkpoint: str) -> int:
    return int(checkpoint.rpartition("-step")[2])


async def test_the_transcript_view_shows_the_checkpoint_each_pinned_seat_played(
    ledger: Ledger, monitor_settings: Settings
) -> None:
    run = f"selfplay-view-{uuid.uuid4().hex[:8]}"
    policy = run_policy(run, "default")
    note = "base (latest-1: no checkpoint of the policy yet, played the base)"
    seats = {"player": f"{run}/g000000-0/player", "rival": f"{run}/g000000-0/rival"}
    for agent, seat in seats.items():
        checkpoint = "base" if agent == "rival" else None
        await open_seat(
            ledger,
            b"s" * 32,
            seat_id=seat,
            agent=agent,
            policy=policy,
            run=run,
            episode="g000000-0",
            checkpoint=checkpoint,
        )
    ended = EpisodeEnded(
        run=run,
        episode="g000000-0",
        group=0,
        finished=True,
        rewards={"player": 1.0, "rival": 0.0},
        seats=seats,
        pinned={"rival": note},
    )
    await ledger.append_one(run_episodes_stream(run), NewEvent(ended.key, ended.kind, ended.to_payload()))

    app = await asyncio.to_thread(view, "transcripts", monitor_settings, run=run)
    lines = [m.value for m in app.markdown if "seat" in m.value]
    assert any("rival" in line and f"pinned to {plain(note)}" in line for line in lines), lines
    assert not any("player" in line and "pinned" in line for line in lines), lines
