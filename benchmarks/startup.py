"""What a person waits for before the CLI answers: `rollout --help` and `rollout status --json`, each run as a new
process, against the baseline of the same interpreter starting and exiting (`python -c pass`), in the same run.

Measured: the wall time of `ROUNDS` runs of each (the stack need not be up: `status` then reports every service
down, which is the same work). Targets: `rollout --help` at most 0.6 s and `rollout status --json` at most 1 s
(p50). The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
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


def timed(command: list[str], rounds: int) -> list[float]:
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        seconds.append(time.perf_counter() - started)
    return seconds


def main(*, quick: bool = False) -> int:
    rounds = 3 if quick else ROUNDS
    print(f"startup: {rounds} runs each, {platform.machine()}, {platform.python_version()}", file=sys.stderr)
    p50 = {}
    for name, command in COMMANDS.items():
        seconds = timed(command, rounds)
        p50[name] = round(statistics.median(seconds), 3)
        print(f"  {name:<24} p50 {p50[name]:.3f} s  max {max(seconds):.3f} s", file=sys.stderr)
    met = {name: p50[name] <= target for name, target in TARGETS_S.items()}
    print(json.dumps({"p50_s": p50, "targets_s": TARGETS_S, "met": met}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
