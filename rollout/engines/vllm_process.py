"""`rollout engine serve --kind vllm`: a `vllm serve` child process with the serving follower beside it.

Contract:
- `serve_vllm` starts `vllm serve` (argv and environment from `rollout.engines.vllm_launcher.command`: the
  engine API key in its environment) in its own process group, waits until it answers `/health` (reporting
  progress; vLLM takes minutes to load a large model), then runs the serving follower against it over vLLM's
  HTTP API, with that key, until the child exits or this coroutine is cancelled. It returns the child's exit
  status.
- A child that exits before it is healthy is reported with the tail of its output (`VLLMStartError`).
- Cancelled, or sent SIGTERM or SIGINT (Ctrl-C, the supervisor restarting the engine), it stops the child:
  SIGTERM, then SIGKILL after `stop_grace_s`; a second signal does not cut that short. The child stays in this
  process's group, so whoever kills the group (the stack's supervisor) kills vLLM too, and it is told to exit
  when this process dies (PR_SET_PDEATHSIG on Linux): no vLLM outlives the `rollout engine serve` that started
  it.
- A follower that dies of an error is reported at once; vLLM goes on serving what it holds.

"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from rollout.blobs import BlobStore
from rollout.engines.factory import follow_forever
from rollout.engines.follower import FollowerConfig
from rollout.engines.vllm_client import VLLMEngine
from rollout.engines.vllm_launcher import VLLMLaunch, command


class VLLMStartError(RuntimeError):
    """`vllm serve` exited before it answered; the message holds the end of its output."""


async def serve_vllm(
    launch: VLLMLaunch,
    *,
    follower: FollowerConfig | None,
    ledger_url: str,
    store: Callable[[], BlobStore],
    cache_dir: Path,
    log_path: Path,
    report: Callable[[str], None],
    ready_timeout_s: float = 1800.0,
    stop_grace_s: float = 30.0,
) -> int:
    """Run `vllm serve` and its follower until the child exits (its status) or this is cancelled."""
    argv, env = command(launch)
    _stop_on_signals()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as output:
        child = await asyncio.create_subprocess_exec(
            *argv,
            env={**os.environ, **env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=exit_with_parent,
        )
    engine = VLLMEngine(
        f"http://{launch.host}:{launch.port}",
        api_key=launch.api_key,
        name=follower.engine if follower else "vllm",
    )
    following: asyncio.Task[None] | None = None
    try:
        await _until_healthy(engine, child, log_path, report, ready_timeout_s)
        report(f"vLLM is serving {launch.model} as '{launch.served_name}' on {engine.base_url}")
        if follower is not None:
            following = asyncio.create_task(
                follow_forever(engine, follower, ledger_url, store(), cache_dir, report)
            )
            following.add_done_callback(lambda task: _report_death(task, report))
        return await child.wait()
    finally:
        if following is not None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await following
        with contextlib.suppress(Exception):
            await engine.close()
        await asyncio.shield(_stop(child, stop_grace_s))


def _stop_on_signals() -> None:
    """The first SIGTERM or SIGINT cancels this task (Python's default for SIGTERM is to exit at once,
    skipping the `finally` that stops vLLM); later ones are ignored while vLLM stops."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def first_signal() -> None:
        for signum in signals:
            loop.add_signal_handler(signum, lambda: None)
        task.cancel()

    for signum in signals:
        loop.add_signal_handler(signum, first_signal)


def exit_with_parent() -> None:
    """In the child, before exec: SIGTERM it when its parent dies (Linux), even of SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _report_death(task: asyncio.Task[None], report: Callable[[str], None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        report(f"the serving follower stopped: {type(error).__name__}: {error}; vLLM serves what it holds")


async def _until_healthy(
    engine: VLLMEngine,
    child: asyncio.subprocess.Process,
    log_path: Path,
    report: Callable[[str], None],
    timeout_s: float,
) -> None:
    started = time.monotonic()
    next_report = started + 30
    while not await engine.health():
        if child.returncode is not None:
            raise VLLMStartError(
                f"vllm serve exited with status {child.returncode} before it answered; the end of its output "
                f"({log_path}):\n{_tail(log_path)}"
            )
        now = time.monotonic()
        if now - started > timeout_s:
            raise VLLMStartError(f"vllm serve did not answer within {timeout_s:.0f} s; see {log_path}")
        if now >= next_report:
            report(f"vLLM is still loading ({now - started:.0f} s); its output is in {log_path}")
            next_report = now + 30
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.wait(), 1.0)


async def _stop(child: asyncio.subprocess.Process, grace_s: float) -> None:
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        await asyncio.wait_for(child.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no output)"
