"""Many writers, threads and processes (each a fresh interpreter), with overlapping keys; a writer SIGKILLed
after its commit."""

import asyncio
import os
import signal
import sys
import threading
import uuid
from pathlib import Path

from rollout.ledger import Ledger, NewEvent
from tests.ledger_writer import write_overlapping

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


async def writer_process(ledger_url: str, *argv: str) -> asyncio.subprocess.Process:
    """`python -m tests.ledger_writer ARGV...` writing to `ledger_url`, its stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.ledger_writer",
        *argv,
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "LEDGER_URL": ledger_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_processes_with_overlapping_keys_append_each_key_once(ledger: Ledger, ledger_url: str) -> None:
    streams = [f"procs/{uuid.uuid4().hex[:8]}/{i}" for i in range(3)]
    writers = [
        await writer_process(ledger_url, "overlap", str(KEYS), str(seed), *streams) for seed in range(4)
    ]
    outputs = await asyncio.gather(*(writer.communicate() for writer in writers))
    for writer, (_, errors) in zip(writers, outputs, strict=True):
        assert writer.returncode == 0, errors.decode()[-4000:]
    assert sum(int(printed) for printed, _ in outputs) == len(streams) * KEYS
    await assert_each_key_once_gap_free(ledger, streams)


async def test_a_writer_killed_after_commit_then_retried_leaves_one_event(
    ledger: Ledger, ledger_url: str
) -> None:
    stream, key = f"sigkill/{uuid.uuid4().hex[:8]}", "episode-7/turn/3"
    child = await writer_process(ledger_url, "die", stream, key)
    _, errors = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL, errors.decode()
    (retry,) = await ledger.append(stream, [NewEvent(key, "Test", {"key": key})])
    assert retry.appended is False
    assert [(e.seq, e.key) for e in await ledger.read(stream)] == [(1, key)]
