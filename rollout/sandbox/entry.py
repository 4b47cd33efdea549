"""How a jailed command's first process enters its cgroup, rlimits and uid without this process forking.

Contract:
- `entry_argv(limits, nproc=, cgroup_procs=, uid=)` is an argument list to put before a command (bubblewrap,
  or the command itself unjailed) so that, before it runs, its process joins the cgroups whose `cgroup.procs`
  files are `cgroup_procs` (a `/bin/sh` that writes its own pid there, or stops the command with 126), takes
  the jail's rlimits (`prlimit`: address space, file size, open files, CPU, `nproc` processes, no core files),
  and, when `uid` is given (run by root), becomes `uid` with no supplementary groups (`setpriv`). The same
  steps, in the same order, as `rollout.sandbox.limits.apply_rlimits` in a `preexec_fn`.
- It is None where `prlimit` or `setpriv` (util-linux) is missing: the caller then enters them in a
  `preexec_fn`.
- `outside_and_inside(environment)` splits a command's environment into what the programs that run before the
  jail (these, and bubblewrap itself, on the host: as root, when rollout is) may be started with, and the
  variables that change how a program starts or what a shell runs (`LD_*`, glibc's list of variables it drops
  for set-uid programs, `BASH_ENV`, `ENV`, `SHELLOPTS`, exported shell functions, ...). Those the command gets
  only inside the jail (bubblewrap's `--setenv`): given to the programs outside, `LD_PRELOAD` naming a file
  the command wrote would run its code on the host.
- Why: a `preexec_fn` makes Python fork this whole process for each command (not vfork), and a fork's cost
  grows with the process's memory: 6 to 9 ms per command in the benchmark's process, more in a bigger one
  (benchmarks/RESULTS.md, "sandbox"). Three small programs started the cheap way cost less than that.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from rollout.security.isolation import JailLimits

# Joins each cgroup named after the count, then runs the rest: `sh -c JOIN sh N FILE... COMMAND...`.
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n-1)); done; exec "$@"'


# What makes a program load, or a shell run, code of the environment's choosing: glibc's UNSECURE_ENVVARS
# (what it drops for set-uid programs), and what shells read at start.
_UNSAFE_PREFIXES = ("LD_", "MALLOC_", "BASH_FUNC_")
_UNSAFE = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
    }
)


def outside_and_inside(environment: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    outside: dict[str, str] = {}
    inside: dict[str, str] = {}
    for name, value in environment.items():
        unsafe = name in _UNSAFE or name.startswith(_UNSAFE_PREFIXES)
        (inside if unsafe else outside)[name] = value
    return outside, inside


@functools.cache
def _programs() -> tuple[str, str] | None:
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    return (prlimit, setpriv) if prlimit and setpriv else None


def entry_argv(
    limits: JailLimits, *, nproc: int, cgroup_procs: Sequence[Path] = (), uid: int | None = None
) -> list[str] | None:
    programs = _programs()
    if programs is None:
        return None
    prlimit, setpriv = programs
    argv: list[str] = []
    if cgroup_procs:
        argv += ["/bin/sh", "-c", _JOIN, "sh", str(len(cgroup_procs)), *map(str, cgroup_procs)]
    argv += [
        prlimit,
        f"--as={limits.address_space_bytes}:{limits.address_space_bytes}",
        f"--fsize={limits.file_bytes}:{limits.file_bytes}",
        f"--nofile={limits.open_files}:{limits.open_files}",
        f"--cpu={limits.cpu_s}:{limits.cpu_s}",
        f"--nproc={nproc}:{nproc}",
        "--core=0:0",
        "--",
    ]
    if uid is not None:
        argv += [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return argv
