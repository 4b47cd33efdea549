"""A jail's disk and memory caps where neither a cgroup nor a tmpfs holds them: rollout run by a user without
root, whose jails get the per-process rlimits only (rollout.sandbox.limits, rollout.sandbox.workspace).

Contract:
- `disk_used(folder)` is what the files under `folder` take on disk (allocated blocks, at least one block per
  entry, so a million empty files count; links not followed); a folder the jail made unreadable or
  unsearchable (its own uid's) is made readable again to be counted, through a descriptor of the folder
  itself (a link swapped in is never followed).
- `held_deleted(roots, folder)` is what the files the processes `roots` and everything they started hold open
  after deleting them take on `folder`'s file system: invisible to `disk_used`, yet on the disk until closed.
- `resident(roots)` is the resident memory of the processes `roots` and everything they started.
- `guard(roots, folder=, disk_bytes=, memory_bytes=)` looks every `POLL_S` while the command runs; once its
  command grew `folder` past `disk_bytes` (measured from what the folder held when it began, so a command
  may always delete; files its processes deleted but hold open count too), or its processes together hold
  more than `memory_bytes`, it kills each root's process
  group (a bubblewrap's: its PID namespace, and so every process of the command, dies with it) and returns
  why, in a sentence the command's output gets. It never returns otherwise; cancel it when the command ends.
- What it bounds is how long a command may run over its caps, not how far: one `POLL_S` of writing at the
  disk's speed per command (tests/test_jail_unprivileged.py measures it; rollout.sandbox.jail lets no later
  command add to what a command left over the cap). Memory is counted as resident sets,
  so pages processes share count once per process (a cap that errs towards killing). `Jail.spawn`'s
  processes (a grader's conversation) are not watched.
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
BLOCK = 4096


def _open_up(folder: Path) -> None:
    """Make `folder` (the jail's own, made unreadable to hide what it holds) readable again, never following
    a link the jail may have swapped in meanwhile: through an O_PATH descriptor of the folder itself."""
    with contextlib.suppress(OSError):
        handle = os.open(folder, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        finally:
            os.close(handle)


def _entries(folder: Path) -> list[tuple[str, os.stat_result]]:
    for attempt in range(2):
        try:
            return [(e.path, e.stat(follow_symlinks=False)) for e in os.scandir(folder)]
        except PermissionError:  # unlistable, or listable but not searchable (0400)
            if attempt == 0:
                _open_up(folder)
        except OSError:
            break
    return []


def disk_used(folder: Path) -> int:
    total = 0
    pending = [folder]
    while pending:
        for path, info in _entries(pending.pop()):
            # An empty file takes an inode all the same: each entry counts one block at least.
            total += max(info.st_blocks * 512, BLOCK)
            if stat.S_ISDIR(info.st_mode):
                pending.append(Path(path))
    return total


def _processes(roots: Collection[int]) -> list[psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for root in roots:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(root)
            for each in (process, *process.children(recursive=True)):
                found.setdefault(each.pid, each)
    return list(found.values())


def resident(roots: Collection[int]) -> int:
    total = 0
    for each in _processes(roots):
        with contextlib.suppress(psutil.Error):
            total += each.memory_info().rss
    return total


def held_deleted(roots: Collection[int], folder: Path) -> int:
    try:
        device = os.stat(folder).st_dev
    except OSError:
        return 0
    seen: dict[int, int] = {}  # inode -> bytes: a file two processes hold counts once
    for each in _processes(roots):
        descriptors = f"/proc/{each.pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(descriptors):
                with contextlib.suppress(OSError):
                    if not os.readlink(f"{descriptors}/{fd}").endswith(" (deleted)"):
                        continue
                    info = os.stat(f"{descriptors}/{fd}")
                    if info.st_dev == device and stat.S_ISREG(info.st_mode):
                        seen[info.st_ino] = info.st_blocks * 512
    return sum(seen.values())


def _disk_held(roots: Collection[int], folder: Path) -> int:
    return disk_used(folder) + held_deleted(list(roots), folder)


async def guard(roots: Collection[int], *, folder: Path | None, disk_bytes: int, memory_bytes: int) -> str:
    baseline = 0 if folder is None else await asyncio.to_thread(disk_used, folder)
    allowed = max(disk_bytes, baseline)
    while True:
        await asyncio.sleep(POLL_S)
        reason = None
        if folder is not None and (used := await asyncio.to_thread(_disk_held, roots, folder)) > allowed:
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
