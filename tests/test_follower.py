"""Followers read by cursor and wake on NOTIFY; a Postgres restart loses and repeats nothing."""

import asyncio
from pathlib import Path

from rollout.ledger import Ledger, NewEvent, RecordedEvent, migrate
from rollout.ledger.follower import Follower
from rollout.net import free_port
from rollout.stack.postgres import EmbeddedPostgres


async def collect(follower: Follower, into: list[RecordedEvent], until: int) -> None:
    async for event in follower.events():
        into.append(event)
        if len(into) >= until:
            return


async def test_a_follower_sees_every_event_once_in_order_across_a_postgres_restart(tmp_path: Path) -> None:
    postgres = EmbeddedPostgres(tmp_path, "127.0.0.1", free_port())
    await asyncio.to_thread(postgres.start)
    url = postgres.url("rollout")
    try:
        await asyncio.to_thread(migrate.upgrade, url)
        streams = ["a", "b"]
        seen: list[RecordedEvent] = []
        # Start after a cursor: events at or before it must not be delivered.
        async with await Ledger.connect(url) as ledger:
            await ledger.append("a", [NewEvent("before", "T", {"n": 0})])
        follower = Follower(url, streams, after={"a": 1}, poll_interval_s=0.5)
        consumer = asyncio.create_task(collect(follower, seen, until=40))

        async with await Ledger.connect(url) as ledger:
            for n in range(1, 11):
                await ledger.append(streams[n % 2], [NewEvent(f"k{n}", "T", {"n": n})])
        await asyncio.sleep(0.3)

        await asyncio.to_thread(postgres.restart)  # drops the follower's connection and its LISTEN

        async with await Ledger.connect(url) as ledger:
            for n in range(11, 41):
                await ledger.append(streams[n % 2], [NewEvent(f"k{n}", "T", {"n": n})])
        await asyncio.wait_for(consumer, timeout=60)
    finally:
        await asyncio.to_thread(postgres.stop)

    assert follower.reconnects >= 1, "the restart should have cut the follower's connection"
    assert sorted(e.payload["n"] for e in seen) == list(
        range(1, 41)
    )  # each once, none from before the cursor
    for stream in streams:
        seqs = [e.seq for e in seen if e.stream == stream]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert follower.cursors == {"a": 21, "b": 20}


async def test_a_notification_wakes_the_follower_before_its_poll_timer(
    ledger: Ledger, ledger_url: str, stream: str
) -> None:
    follower = Follower(ledger_url, [stream], poll_interval_s=30)
    seen: list[RecordedEvent] = []
    consumer = asyncio.create_task(collect(follower, seen, until=1))
    await asyncio.sleep(0.5)  # the follower has drained the empty stream and now waits on NOTIFY
    await ledger.append(stream, [NewEvent("x", "T", {})])
    await asyncio.wait_for(consumer, timeout=5)  # far sooner than the 30 s poll
    assert [e.key for e in seen] == ["x"]
