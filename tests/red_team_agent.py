"""The command seat of tests/red_team.py, standing in for Claude Code: stdlib only, run in its seat's jail.

    python red_team_agent.py WORKDIR

Reads `WORKDIR/attacks.json` (what its Task's `prepare` wrote), runs the probe, then each attack with bash,
and writes `WORKDIR/results.json`: the probe's output and each attack's `verdict=N` line. The attacks that
would harm the machine if the jail failed run only once the probe showed a PID namespace of its own and
rlimits in force.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def run(command: str) -> str:
    # Each command is a session of its own, killed whole once it returns, as the shell sandbox kills a
    # command's jail: a fork bomb's survivors would otherwise hold every process the seat may have, and the
    # next fork fails.
    for _attempt in range(50):
        try:
            child = subprocess.Popen(
                ["bash", "-c", command],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
            break
        except BlockingIOError:
            time.sleep(0.1)
    else:
        return "could not fork"
    try:
        output, _ = child.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        output = "timed out"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    return output.strip()


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
