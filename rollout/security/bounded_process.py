"""Run a command with limits: a time limit (its whole process group is killed) and an output budget.

Contract: stdout and stderr are merged in order. `keep="head"` keeps the first `max_output_bytes` (the rest
is read and dropped, `truncated` says so); `keep="tail"` keeps the last ones. On a timeout, or when the
awaiting task is cancelled, the command's session is killed with SIGKILL (children included) and reaped;
a timed-out command has no exit code. The command runs what an agent or a model chose: it inherits this
process's environment less every variable named like a secret (API keys, tokens, passwords: an agent reads its
environment, and what it reads reaches its transcript and the ledger), with `env` on top; with `inherit=False`
its environment is `env` alone. `preexec_fn` is subprocess's (a jail enters its limits there); `started` is
told the command's pid, which is also its session's and process group's, as soon as it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rollout.security.redaction import without_secrets


@dataclass(frozen=True)
class ProcessOutcome:
    exit_code: int | None
    output: str
    truncated: bool
    timed_out: bool


async def run_bounded(
    argv: Sequence[str],
    *,
    cwd: str | Path,
    env: Mapping[str, str],
    timeout_s: float,
    max_output_bytes: int,
    keep: Literal["head", "tail"] = "head",
    inherit: bool = True,
    preexec_fn: Callable[[], None] | None = None,
    started: Callable[[int], None] | None = None,
) -> ProcessOutcome:
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env={**without_secrets(os.environ), **env} if inherit else dict(env),
        preexec_fn=preexec_fn,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    if started is not None:
        started(process.pid)  # its process group's id too: a watchdog may kill the group
    kept = bytearray()
    truncated = False

    async def drain() -> None:
        nonlocal truncated
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            kept.extend(chunk)
            if len(kept) > max_output_bytes:
                truncated = True
                if keep == "head":
                    del kept[max_output_bytes:]
                else:
                    del kept[:-max_output_bytes]
        await process.wait()

    timed_out = False
    try:
        await asyncio.wait_for(drain(), timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    exit_code = None if timed_out else process.returncode
    return ProcessOutcome(
        exit_code=exit_code, output=kept.decode(errors="replace"), truncated=truncated, timed_out=timed_out
    )
