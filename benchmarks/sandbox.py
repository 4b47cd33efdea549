"""What the jail costs: a `shell` sandbox's commands run jailed (bubblewrap) against the same commands
unjailed (`sandbox.isolation=none`), in the same run, on the same machine.

Measured, for each isolation, through `ShellWorld.act` (what a tool call pays, less the HTTP hop):
- `true`: the jail's own cost (namespaces, mounts, cgroup, rlimits) over a fork and exec;
- `python3 -c pass`: an interpreter's start, which reads the read-only root's files;
- 1 MB of output: the output pipe and its bound (the tool keeps its head);
- reset: `ShellWorld.reset()` after a command left 200 files and a background process behind (kills the jail's
  processes, then clears the workspace).

Targets: the jail adds at most 10 ms to the p50 of `true`, and a reset takes at most 100 ms (p50). The last
line printed is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rollout.config import SandboxIsolation
from rollout.sandbox.jail import jail_problem
from rollout.sandbox.shell import ShellWorld

COMMANDS = {
    "true": "true",
    "python": "python3 -c pass",
    "output_1mb": "head -c 1000000 /dev/zero | tr '\\0' x",
}
LITTER = "mkdir -p litter && for i in $(seq 200); do echo $i > litter/$i; done; (sleep 30 &) ; true"
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
    jailed, unjailed = measured["bwrap"], measured["none"]
    for name in [*COMMANDS, "reset"]:
        print(
            f"{name:>11}: jailed p50 {jailed[name]['p50']:8.2f} ms  p99 {jailed[name]['p99']:8.2f} ms   "
            f"unjailed p50 {unjailed[name]['p50']:8.2f} ms  p99 {unjailed[name]['p99']:8.2f} ms",
            file=sys.stderr,
        )
    added = {name: round(jailed[name]["p50"] - unjailed[name]["p50"], 2) for name in COMMANDS}
    result: dict[str, object] = {
        "benchmark": "sandbox",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "root": os.geteuid() == 0,
        "rounds": rounds,
        "jailed_ms": jailed,
        "unjailed_ms": unjailed,
        "added_p50_ms": added,
        "target_added_p50_10ms_met": added["true"] <= ADDED_P50_TARGET_MS,
        "target_reset_p50_100ms_met": jailed["reset"]["p50"] <= RESET_P50_TARGET_MS,
    }
    print(json.dumps(result))
    return 0
