"""What a jailed command may use: per-process rlimits, and a cgroup capping a jail's processes and memory
together.

Contract:
- `JailLimits` (rollout.security.isolation) has one default per kind of jail: `SHELL_LIMITS` for a `shell`
  sandbox's commands, `COMMAND_LIMITS` for a command seat's process tree; a grader makes its own, and an
  environment's `SandboxSpec.limits` replaces a sandbox kind's for its claims.
- `apply_rlimits(limits, nproc)` runs in the child between fork and exec (nothing but system calls):
  RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CPU from `limits`, and RLIMIT_NPROC `nproc`, soft and hard (a
  command cannot raise them again). RLIMIT_NPROC counts every task of the jail's real uid on the host, so the
  caller says what it is (rollout.sandbox.jail: what the uid runs already plus the jail's share).
- `JailCgroup.create(name, limits)` makes a cgroup (v1 `pids` and `memory` hierarchies, or v2's unified one)
  under this process's own, capping every task of the jail together (`pids.max`, the memory limit, swap
  included where the host accounts it). Without permission (not root) or controllers it returns None and
  `cgroup_problem()` says why: the rlimits are then the only cap. `join()` (in the child) moves the calling
  process in; `pids()` lists what runs in it; `remove()` kills what is left and removes the cgroup.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from pathlib import Path

from rollout.security.isolation import GiB, JailLimits

CGROUP_ROOT = Path("/sys/fs/cgroup")


SHELL_LIMITS = JailLimits()
# Claude Code and Codex are Node programs: more threads, a larger heap, and a V8 that reserves address space.
COMMAND_LIMITS = JailLimits(processes=512, memory_bytes=4 * GiB, address_space_bytes=64 * GiB, cpu_s=3600)


def tasks_of_uid(uid: int) -> int:
    """How many tasks (threads included) the host runs under real uid `uid`: what RLIMIT_NPROC counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields_ = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields_.get("Uid", "").split("\t", 1)[0] == str(uid):
            count += int(fields_.get("Threads", "1"))
    return count


def apply_rlimits(limits: JailLimits, nproc: int) -> None:
    for which, value in (
        (resource.RLIMIT_AS, limits.address_space_bytes),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_NPROC, nproc),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in `controller`'s hierarchy ("" for v2's unified one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers.split(",") == [controller] or (controller == "" and controllers == ""):
            return path
    return None


def _unified() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").is_file()


def cgroup_problem() -> str | None:
    """Why a jail's processes and memory cannot be capped together on this host, or None."""
    if os.geteuid() != 0:
        return "cgroups need root: only the per-process rlimits cap processes and memory"
    if _unified():
        own = _own_cgroup("")
        controllers = (CGROUP_ROOT / (own or "/").lstrip("/") / "cgroup.controllers").read_text().split()
        missing = {"pids", "memory"} - set(controllers)
        return f"the cgroup v2 controllers {sorted(missing)} are not enabled here" if missing else None
    missing = [c for c in ("pids", "memory") if not (CGROUP_ROOT / c / "cgroup.procs").is_file()]
    return f"the cgroup v1 hierarchies {missing} are not mounted" if missing else None


class JailCgroup:
    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders

    @classmethod
    def create(cls, name: str, limits: JailLimits) -> JailCgroup | None:
        if cgroup_problem() is not None:
            return None
        try:
            return cls._v2(name, limits) if _unified() else cls._v1(name, limits)
        except OSError:
            return None

    @classmethod
    def _v1(cls, name: str, limits: JailLimits) -> JailCgroup:
        pids = CGROUP_ROOT / "pids" / (_own_cgroup("pids") or "/").lstrip("/") / name
        memory = CGROUP_ROOT / "memory" / (_own_cgroup("memory") or "/").lstrip("/") / name
        made = cls([pids, memory])
        for folder in made.folders:
            folder.mkdir(exist_ok=True)
        (pids / "pids.max").write_text(str(limits.processes))
        (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        with contextlib.suppress(OSError):  # only where the host accounts swap
            (memory / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
        return made

    @classmethod
    def _v2(cls, name: str, limits: JailLimits) -> JailCgroup:
        folder = CGROUP_ROOT / (_own_cgroup("") or "/").lstrip("/") / name
        folder.mkdir(exist_ok=True)
        made = cls([folder])
        (folder / "pids.max").write_text(str(limits.processes))
        (folder / "memory.max").write_text(str(limits.memory_bytes))
        with contextlib.suppress(OSError):
            (folder / "memory.swap.max").write_text("0")
        return made

    def join(self) -> None:
        """Move the calling process in (called in the child, before exec: what it starts is capped from
        birth)."""
        for folder in self.folders:
            descriptor = os.open(folder / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(descriptor, str(os.getpid()).encode())
            finally:
                os.close(descriptor)

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.folders[0] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        self.kill()
        for folder in self.folders:
            for _ in range(200):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # its last tasks are still being reaped
                    self.kill()
                    time.sleep(0.01)
