"""What the jail costs: a `shell` sandbox's commands run jailed (bubblewrap) against the same commands
unjailed (`sandbox.isolation=none`), in the same run, on the same machine.

Measured, for each isolation, through `ShellWorld.act` (what a tool call pays, less the HTTP hop):
- `true`: the jail's own cost (namespaces, mounts, cgroup, rlimits) over a fork and exec;
- `python3 -c pass`: an interpreter's start, which reads the read-only root's files;
- 1 MB of output: the output pipe and its bound (the tool keeps its head);
- reset: `ShellWorld.reset()` after a command left 200 files and a background process behind (kills the jail's
  processes, then clears the workspace).

Then where a jail's cost goes: bubblewrap running `/bin/true` alone, with each part of the jail's argument
list added in turn (a bare root, the namespaces, `/etc` bound entry by entry as before, `/etc` as one prepared
folder as now, the whole root as `Jail` builds it), interleaved round by round so each sees the same machine.

Targets: the jail adds at most 10 ms to the p50 of `true`, and a reset takes at most 100 ms (p50). The last
line printed is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollout.config import SandboxIsolation
from rollout.sandbox.entry import entry_argv
from rollout.sandbox.jail import (
    ETC_FILES,
    JAIL_UID,
    _drop_privileges,
    _namespaces,
    _root_filesystem,
    jail_problem,
)
from rollout.sandbox.jail_etc import jail_etc
from rollout.sandbox.shell import ShellWorld
from rollout.security.isolation import JailLimits

COMMANDS = {
    "true": "true",
    "python": "python3 -c pass",
    "output_1mb": "head -c 1000000 /dev/zero | tr '\\0' x",
}
LITTER = "mkdir -p litter && for i in $(seq 200); do echo $i > litter/$i; done; (sleep 30 >/dev/null 2>&1 &) ; true"
ADDED_P50_TARGET_MS = 10.0
RESET_P50_TARGET_MS = 100.0


def _quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p99": round(p99, 2)}


async def _measure(isolation: SandboxIsolation, folder: Path, rounds: int) -> dict[str, dict[str, float]]:
    world = ShellWorld(folder, 1, isolation=isolation)
    timings: dict[str, list[float]] = {name: [] for name in [*COMMANDS, "reset"]}
    try:
        for name, command in COMMANDS.items():
            await world.act(0, {"command": command})  # warm the page cache and the interpreter's files
            for _ in range(rounds):
                started = time.perf_counter()
                done = await world.act(0, {"command": command})
                timings[name].append((time.perf_counter() - started) * 1000)
                assert done["exit_code"] == 0, done
        for _ in range(max(5, rounds // 5)):
            await world.act(0, {"command": LITTER})
            started = time.perf_counter()
            await world.reset()
            timings["reset"].append((time.perf_counter() - started) * 1000)
            assert not any(world.workdir.iterdir()), "the reset left files behind"
    finally:
        await world.close()
    return {name: _quantiles(samples) for name, samples in timings.items()}


def _bubblewrap_variants() -> dict[str, list[str]]:
    """bubblewrap's argument lists, each adding one part of the jail's to the one before (none of them
    gives the workspace; each runs `/bin/true`)."""
    bare = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib64"):
        path = Path("/", top)
        if path.is_symlink():
            bare += ["--symlink", os.readlink(path), str(path)]
    spaced = [*_namespaces(), *bare]
    one_by_one = [arg for name in ETC_FILES for arg in ("--ro-bind-try", f"/etc/{name}", f"/etc/{name}")]
    return {
        "bare root": bare,
        "+ namespaces": spaced,
        "+ /etc entry by entry (before)": [*spaced, *one_by_one],
        "+ /etc as one folder (now)": [*spaced, "--ro-bind", str(jail_etc(ETC_FILES)), "/etc"],
        "the jail's whole root, entered in a preexec_fn (before)": [*_namespaces(), *_root_filesystem(())],
    }


def _bubblewrap_breakdown(rounds: int) -> dict[str, float]:
    """p50 of each variant, and of `/bin/true` itself started without and with a function run in the child
    before exec (what `Jail` needs for the cgroup, rlimits and uid: Python must then fork this whole process
    rather than spawn)."""
    entry = entry_argv(JailLimits(), nproc=4096, uid=JAIL_UID if os.geteuid() == 0 else None) or []
    root = [*_namespaces(), *_root_filesystem(())]
    variants = {
        "/bin/true, spawned": (["/bin/true"], None),
        "/bin/true, forked (a preexec_fn)": (["/bin/true"], _drop_privileges),
        **{
            f"bubblewrap, {name}": (["bwrap", *argv, "--", "/bin/true"], _drop_privileges)
            for name, argv in _bubblewrap_variants().items()
        },
        "bubblewrap, the jail's whole root, entered by programs (now)": (
            [*entry, "bwrap", *root, "--", "/bin/true"],
            None,
        ),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (argv, before_exec) in variants.items():
            started = time.perf_counter()
            subprocess.run(argv, check=True, preexec_fn=before_exec)
            samples[name].append((time.perf_counter() - started) * 1000)
    return {name: round(statistics.median(times), 2) for name, times in samples.items()}


def main(quick: bool = False) -> int:
    if (problem := jail_problem()) is not None:
        print(f"the jail cannot run on this machine: {problem}", file=sys.stderr)
        return 1
    rounds = 20 if quick else 200
    with tempfile.TemporaryDirectory(prefix="rollout-bench-sandbox-") as scratch:
        measured = {
            isolation.value: asyncio.run(_measure(isolation, Path(scratch) / isolation.value, rounds))
            for isolation in (SandboxIsolation.none, SandboxIsolation.bwrap)
        }
    breakdown = _bubblewrap_breakdown(10 if quick else 100)
    jailed, unjailed = measured["bwrap"], measured["none"]
    for name in [*COMMANDS, "reset"]:
        print(
            f"{name:>11}: jailed p50 {jailed[name]['p50']:8.2f} ms  p99 {jailed[name]['p99']:8.2f} ms   "
            f"unjailed p50 {unjailed[name]['p50']:8.2f} ms  p99 {unjailed[name]['p99']:8.2f} ms",
            file=sys.stderr,
        )
    for name, p50 in breakdown.items():
        print(f"  {name}: p50 {p50:.2f} ms", file=sys.stderr)
    added = {name: round(jailed[name]["p50"] - unjailed[name]["p50"], 2) for name in COMMANDS}
    result: dict[str, object] = {
        "benchmark": "sandbox",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "root": os.geteuid() == 0,
        "rounds": rounds,
        "jailed_ms": jailed,
        "unjailed_ms": unjailed,
        "added_p50_ms": added,
        "breakdown_p50_ms": breakdown,
        "target_added_p50_10ms_met": added["true"] <= ADDED_P50_TARGET_MS,
        "target_reset_p50_100ms_met": jailed["reset"]["p50"] <= RESET_P50_TARGET_MS,
    }
    print(json.dumps(result))
    return 0
