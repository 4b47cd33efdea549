"""The opponents' adapter budget (rollout.serving.states.desired, rollout.engines.follower): a released
self-play opponent stays loaded while the opponents number fewer than `opponent_adapters`, the least recently
requested evicted first; a still-requested one is always held; a re-requested one is not loaded again; each
ack lists the opponents and the budget, and `rollout status`'s engine line says them."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from rollout.blobs import open_store
from rollout.config import ConfigError, Settings, load
from rollout.engines.follower import FollowerConfig, ServingFollower
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import SERVING_REQUESTS, SERVING_TARGETS
from rollout.records.serving import ServingRequest, ServingTarget
from rollout.serving.keys import serving_target_key
from rollout.serving.states import desired, opponents_in
from rollout.stack.health import engine_opponents
from tests.test_policy_models import RecordingEngine

ENGINE_KEY = b"k" * 32  # a follower holding it loads only targets signed with the key derived from it


def _lineage(run: str, versions: range) -> list[ServingTarget]:
    return [ServingTarget(f"{run}/p", f"{run}/p-step{v:06d}", v, run, "lora") for v in versions]


def test_released_opponents_fill_the_budget_most_recent_first_and_requested_ones_always_count() -> None:
    targets = _lineage("r", range(1, 9))
    name = {t.version: t.checkpoint for t in targets}
    newest = [t.version for t in desired(targets, ("lora",), keep=2)]
    assert newest == [8, 7], "no opponent without a request"
    kept = desired(targets, ("lora",), 2, frozenset(), (name[1], name[3], name[2]), opponent_budget=2)
    assert [t.version for t in kept] == [8, 7, 3, 1], "the two most recently requested stay"
    held = desired(targets, ("lora",), 2, frozenset({name[5], name[6]}), (name[1],), opponent_budget=1)
    assert [t.version for t in held] == [8, 7, 6, 5], "requested ones are held even over the budget"
    assert opponents_in(held, 2) == (name[5], name[6])
    again = desired(targets, ("lora",), 2, frozenset({name[7]}), (name[8], name[4]), opponent_budget=1)
    assert [t.version for t in again] == [8, 7, 4], "a newest checkpoint is no opponent: it takes no budget"


async def _request(ledger: Ledger, holder: str, checkpoint: str, *, release: bool = False) -> None:
    request = ServingRequest(holder, checkpoint)
    key, kind = (
        (request.released_key, Kind.SERVING_RELEASED)
        if release
        else (request.requested_key, Kind.SERVING_REQUESTED)
    )
    await ledger.append_one(SERVING_REQUESTS, NewEvent(key, kind, request.to_payload()))


async def test_an_engine_keeps_released_opponents_within_its_budget_and_says_so(
    ledger: Ledger, stack_settings: Settings, tmp_path: Path
) -> None:
    run = f"league-{uuid.uuid4().hex[:8]}"
    targets = _lineage(run, range(1, 7))
    name = {t.version: t.checkpoint for t in targets}
    for target in targets:
        signed = target.signed(serving_target_key(ENGINE_KEY))
        await ledger.append_one(
            SERVING_TARGETS, NewEvent(target.key, Kind.SERVING_TARGET, signed.to_payload())
        )
    engine = RecordingEngine()
    url = f"http://127.0.0.1:{uuid.uuid4().int % 20000 + 30000}"
    config = FollowerConfig(
        engine="league", url=url, runs=(run,), opponent_adapters=2, grace_s=0, ack_key=ENGINE_KEY
    )
    follower = ServingFollower(ledger, engine, open_store(tmp_path.as_uri()), config, tmp_path / "cache")
    await follower.step()
    assert follower.state().opponents == () and set(engine.loaded) == {name[6], name[5]}

    for version in (1, 2, 3):  # three episodes, each against an older opponent, one after the other
        await _request(ledger, f"{run}/g{version}", name[version])
        await follower.step()
        assert name[version] in follower.serving, "a requested opponent is loaded"
        await _request(ledger, f"{run}/g{version}", name[version], release=True)
        await follower.step()
    ack = follower.state()
    assert ack.opponents == (name[2], name[3]), "the least recently requested (1) was evicted"
    assert ack.opponent_budget == 2 and name[1] not in follower.serving

    await _request(ledger, f"{run}/g4", name[2])  # the league draws a recent opponent again
    await follower.step()
    assert engine.loaded.count(name[2]) == 1, "still loaded: not loaded again"
    await _request(ledger, f"{run}/g5", name[1])
    await _request(ledger, f"{run}/g6", name[4])
    await follower.step()
    assert set(follower.state().opponents) == {name[1], name[2], name[4]}, "requested ones exceed the budget"
    for holder, version in (("g4", 2), ("g5", 1), ("g6", 4)):
        await _request(ledger, f"{run}/{holder}", name[version], release=True)
    await follower.step()
    assert follower.state().opponents == (name[1], name[4]), "back within the budget, most recent kept"

    signed = await follower.ack()
    line = await asyncio.to_thread(engine_opponents, stack_settings, url)
    assert signed.signed_by(b"k" * 32) and signed.opponents == (name[1], name[4])
    assert line == f" (opponents held: {name[1]}, {name[4]}; budget 2)"
    assert await asyncio.to_thread(engine_opponents, stack_settings, "http://never-acked.invalid:1") == ""


def test_the_budget_is_a_setting_and_a_negative_one_is_refused_in_one_line() -> None:
    assert load().services.engine.opponent_adapters == 4
    assert load(["services.engine.opponent_adapters=0"]).services.engine.opponent_adapters == 0
    with pytest.raises(
        ConfigError, match=r"^bad value for 'services\.engine\.opponent_adapters': -1 [^\n]*$"
    ):
        load(["services.engine.opponent_adapters=-1"])


async def test_a_forged_serving_target_is_passed_over_and_the_next_one_still_served(
    ledger: Ledger, tmp_path: Path
) -> None:
    """Any ledger writer may append a target: one whose `location` would have an engine fetch an adapter of
    the forger's choosing (vLLM takes a Hub repository there), one that is no target at all, or one the
    trainer did not sign (a huge version would push every engine past `max_lag`) costs only itself."""
    run = f"forged-{uuid.uuid4().hex[:8]}"
    key = serving_target_key(ENGINE_KEY)
    forged = ServingTarget(f"{run}/p", f"{run}/p-step000001", 1, run, "lora").to_payload() | {
        "location": "evil-org/adapter"
    }
    real = ServingTarget(f"{run}/p", f"{run}/p-step000002", 2, run, "lora").signed(key)
    # Well-formed, but not the trainer's: a version far ahead of every other, unsigned or signed wrong.
    unsigned = ServingTarget(f"{run}/p", f"{run}/p-step999999", 999_999, run, "lora")
    wrong = ServingTarget(f"{run}/p", f"{run}/p-step999998", 999_998, run, "lora").signed(b"guessed" * 5)
    junk = {"run": run, "policy": 1}  # no target; `run` as other readers of the stream look for it
    appended = [("forged", forged), ("junk", junk), (real.key, real.to_payload())]
    appended += [(t.key, t.to_payload()) for t in (unsigned, wrong)]
    for event_key, payload in appended:
        await ledger.append_one(SERVING_TARGETS, NewEvent(event_key, Kind.SERVING_TARGET, payload))
    with pytest.raises(ValueError, match="only a tinker target has one"):
        ServingTarget.from_payload(forged)
    engine = RecordingEngine()
    config = FollowerConfig(
        engine="e", url="http://127.0.0.1:1", runs=(run,), poll_s=0.05, ack_key=ENGINE_KEY
    )
    follower = ServingFollower(ledger, engine, open_store(tmp_path.as_uri()), config, tmp_path / "cache")
    await follower.step()
    assert engine.loaded == [real.checkpoint]
