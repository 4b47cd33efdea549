"""The ledger's named read queries against a real Postgres, on events appended by hand in the real shapes."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.payloads import AttemptAbandoned, EpisodeEnded
from rollout.ledger.queries import (
    PolicyProgress,
    checkpoint_payload,
    count_events,
    find_lease,
    find_run,
    held_sandbox,
    list_runs,
    live_lease_holder,
    live_sandbox_hosts,
    newest_checkpoint_version,
    read_all,
    run_progress,
    run_turns,
    seat_and_turn_by_token_hash,
    seat_by_token_hash,
)
from rollout.ledger.streams import (
    policy_checkpoints_stream,
    run_batches_stream,
    run_episodes_stream,
    run_stream,
    sandbox_host_lease,
    sandbox_lease,
    seat_stream,
)
from rollout.records.batches import BatchInfo
from rollout.records.checkpoints import CheckpointRecord
from rollout.run.settings import RunSettings
from rollout.training.checkpoints import checkpoint_name
from rollout.workflows.names import run_policy


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def create_run(ledger: Ledger, run: str, **settings: object) -> None:
    payload = {"run": run, "environment": "arithmetic.environment:environment", "settings": settings}
    await ledger.append_one(run_stream(run), NewEvent("created", Kind.RUN_CREATED, payload))


async def test_runs_are_listed_newest_first_with_their_current_settings(ledger: Ledger) -> None:
    older, newer = unique("older"), unique("newer")
    await create_run(ledger, older, max_lag=1, paused=False)
    await asyncio.sleep(0.01)
    await create_run(ledger, newer, max_lag=2, paused=False)
    change = {"run": newer, "changes": {"paused": True}}
    await ledger.append_one(run_stream(newer), NewEvent("pause", Kind.SETTINGS_CHANGED, change))

    ours = [r for r in await list_runs(ledger) if r.run in (older, newer)]
    assert [r.run for r in ours] == [newer, older]
    assert ours[0].settings == RunSettings(max_lag=2, paused=True) and ours[0].updated_seq == 2
    assert ours[1].environment == "arithmetic.environment:environment" and ours[1].updated_seq == 1
    assert ours[0].created_at > ours[1].created_at
    found = await find_run(ledger, newer)
    assert found == ours[0]
    assert await find_run(ledger, unique("missing")) is None


async def test_events_are_counted_by_stream_and_kind(ledger: Ledger, stream: str) -> None:
    assert await count_events(ledger, stream, Kind.TURN_RECORDED) == 0
    await ledger.append(
        stream,
        [NewEvent(f"t{i}", Kind.TURN_RECORDED, {"i": i}) for i in range(3)]
        + [NewEvent("closed", Kind.SEAT_CLOSED, {})],
    )
    assert await count_events(ledger, stream, Kind.TURN_RECORDED) == 3
    assert await count_events(ledger, stream, Kind.SEAT_CLOSED) == 1


async def test_read_all_pages_through_a_long_stream(ledger: Ledger, stream: str) -> None:
    await ledger.append(stream, [NewEvent(f"e{i}", "Test", {"i": i}) for i in range(1005)])
    events = await read_all(ledger, stream)
    assert [e.seq for e in events] == list(range(1, 1006))


def ended(run: str, group: int, member: int, *, finished: bool = True) -> EpisodeEnded:
    episode = f"g{group:06d}-{member}"
    return EpisodeEnded(
        run=run,
        episode=episode,
        group=group,
        finished=finished,
        environment="e",
        rewards={"solver": 1.0} if finished else {},
        error=None if finished else "TaskFailed: boom",
        seats={"solver": f"{run}/{episode}/solver"},
        turns={"solver": 2},
    )


def batch(run: str, policy: str, step: int, groups: list[int], sampled_tokens: int) -> BatchInfo:
    return BatchInfo(
        run=run,
        policy=policy,
        step=step,
        groups=groups,
        episodes=[f"g{g:06d}-{m}" for g in groups for m in range(2)],
        trained_episodes=[],
        skipped_groups=0 if sampled_tokens else len(groups),
        sampled_tokens=sampled_tokens,
        reward_mean=0.5,
        reward_std=0.5,
    )


def checkpoint(run: str, policy: str, step: int) -> CheckpointRecord:
    return CheckpointRecord(
        name=checkpoint_name(policy, step),
        policy=policy,
        version=step,
        parent=None if step == 1 else checkpoint_name(policy, step - 1),
        run=run,
        files={},
        metrics={"reward_mean": 0.5},
    )


async def test_run_progress_counts_episodes_groups_batches_and_checkpoints(ledger: Ledger) -> None:
    run = unique("progress")
    policy = run_policy(run, "default")
    await create_run(ledger, run)
    episodes = [
        ended(run, 0, 0),
        ended(run, 0, 1),
        ended(run, 1, 0),
        ended(run, 1, 1, finished=False),  # failed as a whole: group 1 ended, not finished
        ended(run, 2, 0),  # group 2 still in flight
    ]
    attempt = AttemptAbandoned(
        run=run, episode="g000002-1", agent="solver", seat=f"{run}/a1", attempt=1, reason="worker lost"
    )
    await ledger.append(
        run_episodes_stream(run),
        [NewEvent(e.key, e.kind, e.to_payload()) for e in episodes]
        + [NewEvent(attempt.key, Kind.EPISODE_ABANDONED, attempt.to_payload())],
    )
    trained, skipped = batch(run, policy, 1, [0, 1], 40), batch(run, policy, 2, [2, 3], 0)
    await ledger.append(
        run_batches_stream(run, policy),
        [NewEvent(f"step/{b.step}", Kind.BATCH_ASSEMBLED, b.to_payload()) for b in (trained, skipped)],
    )
    record = checkpoint(run, policy, 1)
    await ledger.append_one(
        policy_checkpoints_stream(policy), NewEvent("step/1", Kind.CHECKPOINT_CREATED, record.to_payload())
    )

    progress = await run_progress(ledger, run, group_size=2)
    assert (progress.episodes_finished, progress.episodes_failed, progress.attempts_abandoned) == (4, 1, 1)
    assert (progress.groups_recorded, progress.groups_ended, progress.groups_finished) == (3, 2, 1)
    assert progress.policies == {
        policy: PolicyProgress(batches_assembled=2, batches_skipped=1, checkpoints=1, newest_version=1)
    }
    unsized = await run_progress(ledger, run)
    assert unsized.groups_ended is None and unsized.groups_finished is None
    assert unsized.episodes_finished == 4 and unsized.policies == progress.policies


async def test_a_run_with_nothing_recorded_has_no_progress(ledger: Ledger) -> None:
    run = unique("empty")
    progress = await run_progress(ledger, run, group_size=4)
    assert progress.episodes_finished == progress.groups_recorded == 0
    assert progress.groups_ended == progress.groups_finished == 0 and progress.policies == {}


async def test_newest_checkpoint_version_and_checkpoint_payload_by_name(ledger: Ledger) -> None:
    run = unique("ckpt")
    policy = run_policy(run, "default")
    assert await newest_checkpoint_version(ledger, policy) == 0, "the base model is version 0"
    assert await checkpoint_payload(ledger, policy, checkpoint_name(policy, 1)) is None
    records = [checkpoint(run, policy, step) for step in (1, 2)]
    await ledger.append(
        policy_checkpoints_stream(policy),
        [NewEvent(f"step/{r.version}", Kind.CHECKPOINT_CREATED, r.to_payload()) for r in records],
    )
    assert await newest_checkpoint_version(ledger, policy) == 2
    payload = await checkpoint_payload(ledger, policy, checkpoint_name(policy, 1))
    assert payload is not None and CheckpointRecord.from_payload(payload) == records[0]


async def test_a_seat_is_found_by_its_token_hash_with_the_turn_under_a_key(ledger: Ledger) -> None:
    seat, run = unique("seat"), unique("run")
    token_sha256 = hashlib.sha256(seat.encode()).hexdigest()
    opened = {
        "seat": seat,
        "token_sha256": token_sha256,
        "run": run,
        "episode": "g000000-0",
        "agent": "solver",
        "policy": run_policy(run, "default"),
        "checkpoint": None,
    }
    await ledger.append_one(seat_stream(seat), NewEvent("opened", Kind.SEAT_OPENED, opened))
    turn = await ledger.append_one(
        seat_stream(seat), NewEvent("turn/0/abc", Kind.TURN_RECORDED, {"run": run})
    )

    found = await seat_by_token_hash(ledger, token_sha256)
    assert found is not None and (found.seat, found.agent, found.run, found.open) == (
        seat,
        "solver",
        run,
        True,
    )
    assert found.policy == run_policy(run, "default") and found.checkpoint is None
    with_turn, recorded = await seat_and_turn_by_token_hash(ledger, token_sha256, "turn/0/abc")
    assert with_turn == found and recorded is not None
    assert (recorded.stream, recorded.seq, recorded.key, recorded.kind) == (
        seat_stream(seat),
        2,
        "turn/0/abc",
        Kind.TURN_RECORDED,
    )
    assert (
        recorded.payload == {"run": run}
        and recorded.recorded_at == turn.recorded_at
        and not recorded.appended
    )
    assert await seat_and_turn_by_token_hash(ledger, token_sha256, "turn/1/def") == (found, None)
    unknown = hashlib.sha256(b"nobody").hexdigest()
    assert await seat_by_token_hash(ledger, unknown) is None
    assert await seat_and_turn_by_token_hash(ledger, unknown, "turn/0/abc") == (None, None)

    closed = {"seat": seat, "reason": "finished"}
    await ledger.append_one(seat_stream(seat), NewEvent("closed", Kind.SEAT_CLOSED, closed))
    again = await seat_by_token_hash(ledger, token_sha256)
    assert again is not None and not again.open


async def test_a_runs_turns_across_its_seats_in_recording_order(ledger: Ledger) -> None:
    run, other = unique("turns"), unique("other")
    await ledger.append_one(seat_stream(f"{run}/a"), NewEvent("t0", Kind.TURN_RECORDED, {"run": run, "n": 0}))
    await ledger.append_one(seat_stream(f"{other}/a"), NewEvent("t0", Kind.TURN_RECORDED, {"run": other}))
    await ledger.append_one(seat_stream(f"{run}/b"), NewEvent("t0", Kind.TURN_RECORDED, {"run": run, "n": 1}))
    await ledger.append_one(seat_stream(f"{run}/a"), NewEvent("closed", Kind.SEAT_CLOSED, {"run": run}))
    turns = await run_turns(ledger, run)
    assert [(e.stream, e.payload["n"]) for e in turns] == [
        (seat_stream(f"{run}/a"), 0),
        (seat_stream(f"{run}/b"), 1),
    ]


async def test_leases_as_they_stand_and_who_holds_them_now(ledger: Ledger, stream: str) -> None:
    resource = f"{stream}/gpu"
    assert await find_lease(ledger, resource) is None and await live_lease_holder(ledger, resource) is None
    lease = await ledger.claim(resource, "trainer-1", ttl_s=30)
    assert lease is not None
    assert await find_lease(ledger, resource) == lease
    assert await live_lease_holder(ledger, resource) == "trainer-1"
    await ledger.release(lease)
    assert await live_lease_holder(ledger, resource) is None
    released = await find_lease(ledger, resource)
    assert released is not None and released.epoch == lease.epoch and released.holder == "trainer-1"


async def test_live_sandbox_hosts_and_the_sandbox_a_holder_has_claimed(ledger: Ledger) -> None:
    kind, other_kind = unique("kind"), unique("kind")
    assert await live_sandbox_hosts(ledger, kind) == {}
    for name, address in (("box-0", "http://h0"), ("box-1", "http://h1")):
        assert await ledger.claim(sandbox_host_lease(kind, name), address, ttl_s=30) is not None
    gone = await ledger.claim(sandbox_host_lease(kind, "box-2"), "http://h2", ttl_s=30)
    assert gone is not None
    await ledger.release(gone)
    assert await ledger.claim(sandbox_host_lease(f"{kind}x", "box-9"), "http://h9", ttl_s=30) is not None
    assert await live_sandbox_hosts(ledger, kind) == {"box-0": "http://h0", "box-1": "http://h1"}

    assert await held_sandbox(ledger, kind, "run/g0-0") is None
    assert await ledger.claim(sandbox_lease(kind, "box-1"), "run/g0-0", ttl_s=30) is not None
    assert await ledger.claim(sandbox_lease(other_kind, "box-0"), "run/g0-0", ttl_s=30) is not None
    assert await held_sandbox(ledger, kind, "run/g0-0") == "box-1"
    assert await held_sandbox(ledger, other_kind, "run/g0-0") == "box-0"
    assert await held_sandbox(ledger, kind, "run/g0-1") is None
