"""The command seat of tests/red_team.py, standing in for Claude Code: stdlib only, run in its seat's jail.

    python red_team_agent.py WORKDIR

Reads `WORKDIR/attacks.json` (what its Task's `prepare` wrote), runs the probe, then each attack with bash, and
writes `WORKDIR/results.json`: the probe's output and each attack's `verdict=N` line. The attacks that would harm
the machine if the jail failed run only once the probe showed a PID namespace of its own and rlimits in force.
"""

import json
import re
import subprocess
import sys
from pathlib import Path


def run(command: str) -> str:
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "timed out"
    return done.stdout.strip()


def main() -> None:
    workdir = Path(sys.argv[1])
    plan = json.loads((workdir / "attacks.json").read_text())
    probe = run(plan["probe"])
    found = dict(re.findall(r"(\w+)=(\S*)", probe))
    in_force = (
        found.get("pid", "").isdigit()
        and int(found["pid"]) < 10
        and found.get("nproc") not in (None, "", "unlimited")
        and found.get("fsize") not in (None, "", "unlimited")
    )
    results = {}
    for name, command in plan["attacks"]:
        if name in plan["harmful"] and not in_force:
            results[name] = "skipped"
            continue
        answer = run(command)
        results[name] = answer.splitlines()[-1] if answer else ""
    (workdir / "results.json").write_text(json.dumps({"probe": probe, "attacks": results}))


main()
