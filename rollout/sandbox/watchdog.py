"""A jail's disk and memory caps where neither a cgroup nor a tmpfs holds them: rollout run by a user without
root, whose jails get the per-process rlimits only (rollout.sandbox.limits, rollout.sandbox.workspace).

Contract:
- `disk_used(folder)` is what the files under `folder` take on disk (allocated blocks, links not followed); a
  folder the jail made unreadable (`chmod 000`, its own uid's) is made readable again to be counted.
- `resident(roots)` is the resident memory of the processes `roots` and everything they started.
- `guard(roots, folder=, disk_bytes=, memory_bytes=)` looks every `POLL_S` while the command runs; once its
  command grew `folder` past `disk_bytes` (measured from what the folder held when it began, so a command
  may always delete), or its processes together hold more than `memory_bytes`, it kills each root's process
  group (a bubblewrap's: its PID namespace, and so every process of the command, dies with it) and returns
  why, in a sentence the command's output gets. It never returns otherwise; cancel it when the command ends.
- What it bounds is how long a command may run over its caps, not how far: one `POLL_S` of writing at the
  disk's speed (tests/test_jail_unprivileged.py measures it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
from collections.abc import Collection
from pathlib import Path

import psutil

POLL_S = 0.1
MiB = 1024 * 1024


def disk_used(folder: Path) -> int:
    total = 0
    pending = [folder]
    while pending:
        current = pending.pop()
        entries: list[os.DirEntry[str]] = []
        try:
            entries = list(os.scandir(current))
        except PermissionError:
            with contextlib.suppress(OSError):
                os.chmod(current, 0o700)  # the jail's own folder, made unreadable to hide what it holds
                entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if stat.S_ISDIR(info.st_mode):
                pending.append(Path(entry.path))
    return total


def resident(roots: Collection[int]) -> int:
    seen: dict[int, int] = {}
    for root in roots:
        try:
            process = psutil.Process(root)
            for each in (process, *process.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    seen.setdefault(each.pid, each.memory_info().rss)
        except psutil.Error:
            continue
    return sum(seen.values())


async def guard(roots: Collection[int], *, folder: Path | None, disk_bytes: int, memory_bytes: int) -> str:
    baseline = 0 if folder is None else await asyncio.to_thread(disk_used, folder)
    allowed = max(disk_bytes, baseline)
    while True:
        await asyncio.sleep(POLL_S)
        reason = None
        if folder is not None and (used := await asyncio.to_thread(disk_used, folder)) > allowed:
            reason = (
                f"its working directory grew to {used // MiB} MiB, past its cap of {disk_bytes // MiB} MiB"
            )
        elif roots and (held := await asyncio.to_thread(resident, list(roots))) > memory_bytes:
            reason = (
                f"its processes held {held // MiB} MiB of memory, past their cap of {memory_bytes // MiB} MiB"
            )
        if reason is not None:
            for root in list(roots):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(root, signal.SIGKILL)
            return f"the command was killed: {reason}"
