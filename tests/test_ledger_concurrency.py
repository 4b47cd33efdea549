"""Many writers, threads and processes, with overlapping keys; a writer SIGKILLed after its commit."""

import asyncio
import multiprocessing
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from rollout.ledger import Ledger, NewEvent
from tests.ledger_writer import process_main, write_overlapping

KEYS = 40


async def assert_each_key_once_gap_free(ledger: Ledger, streams: list[str]) -> None:
    for stream in streams:
        events = await ledger.read(stream)
        assert [e.seq for e in events] == list(range(1, KEYS + 1)), (
            f"{stream}: seq must be 1..{KEYS} with no gap"
        )
        assert sorted(e.payload["k"] for e in events) == list(range(KEYS)), f"{stream}: each key exactly once"


async def test_threads_with_overlapping_keys_append_each_key_once(ledger: Ledger, ledger_url: str) -> None:
    streams = [f"threads/{uuid.uuid4().hex[:8]}/{i}" for i in range(3)]
    appended: list[int] = []
    lock = threading.Lock()

    def writer(seed: int) -> None:
        count = asyncio.run(write_overlapping(ledger_url, streams, KEYS, seed))
        with lock:
            appended.append(count)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(appended) == 8
    assert sum(appended) == len(streams) * KEYS  # every key appended by exactly one writer
    await assert_each_key_once_gap_free(ledger, streams)


async def test_processes_with_overlapping_keys_append_each_key_once(ledger: Ledger, ledger_url: str) -> None:
    streams = [f"procs/{uuid.uuid4().hex[:8]}/{i}" for i in range(3)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        counts = await asyncio.to_thread(
            pool.starmap, process_main, [(ledger_url, streams, KEYS, s) for s in range(4)]
        )
    assert sum(counts) == len(streams) * KEYS
    await assert_each_key_once_gap_free(ledger, streams)


async def test_a_writer_killed_after_commit_then_retried_leaves_one_event(
    ledger: Ledger, ledger_url: str
) -> None:
    stream, key = f"sigkill/{uuid.uuid4().hex[:8]}", "episode-7/turn/3"
    child = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tests.ledger_writer", ledger_url, stream, key],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    (retry,) = await ledger.append(stream, [NewEvent(key, "Test", {"key": key})])
    assert retry.appended is False
    assert [(e.seq, e.key) for e in await ledger.read(stream)] == [(1, key)]
