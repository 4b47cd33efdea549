"""What a person waits for before the CLI answers: `rollout --help` and `rollout status --json`, each run as a
new process, against the baseline of the same interpreter starting and exiting (`python -c pass`), in the same
run.

Measured: the wall time of `ROUNDS` runs of each (the stack need not be up: `status` then reports every
service down, which is the same work), twice: with Python's bytecode cache, as an installed `rollout` runs
after its first start (Python writes `__pycache__` then; the targets are for this), and without one (every
module compiled from source each time: a machine with PYTHONDONTWRITEBYTECODE set, or a read-only install),
reported beside it. Targets: `rollout --help` at most 0.6 s and `rollout status --json` at most 1 s (p50). The
last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROLLOUT = str(Path(sys.executable).parent / "rollout")
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "rollout --help": [ROLLOUT, "--help"],
    "rollout status --json": [ROLLOUT, "status", "--json"],
}
TARGETS_S = {"rollout --help": 0.6, "rollout status --json": 1.0}
ROUNDS = 10


def timed(command: list[str], rounds: int, env: dict[str, str]) -> list[float]:
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
        seconds.append(time.perf_counter() - started)
    return seconds


def p50_of(rounds: int, env: dict[str, str], label: str) -> dict[str, float]:
    print(f"  {label}:", file=sys.stderr)
    p50 = {}
    for name, command in COMMANDS.items():
        seconds = timed(command, rounds, env)
        p50[name] = round(statistics.median(seconds), 3)
        print(f"    {name:<24} p50 {p50[name]:.3f} s  max {max(seconds):.3f} s", file=sys.stderr)
    return p50


def main(*, quick: bool = False) -> int:
    rounds = 3 if quick else ROUNDS
    print(f"startup: {rounds} runs each, {platform.machine()}, {platform.python_version()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as cache:
        # A bytecode cache of this run's own, so neither measurement depends on what earlier runs left behind.
        cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {
            "PYTHONPYCACHEPREFIX": cache
        }
        for command in COMMANDS.values():  # the first start writes the cache
            timed(command, 1, cached)
        with_cache = p50_of(rounds, cached, "with the bytecode cache (an install after its first start)")
    with tempfile.TemporaryDirectory() as empty:
        compiled = os.environ | {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": empty}
        without_cache = p50_of(rounds, compiled, "without one (every module compiled each start)")
    met = {name: with_cache[name] <= target for name, target in TARGETS_S.items()}
    print(
        json.dumps(
            {
                "benchmark": "startup",
                "machine": f"{platform.machine()} {os.cpu_count()} cpus",
                "p50_s": with_cache,
                "p50_without_bytecode_cache_s": without_cache,
                "targets_s": TARGETS_S,
                "met": met,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
