"""Attacks on the jail from inside the built image, as the policy would make them: scripts/build_images.sh
runs this in the `rollout` image (as its user, 10001, with nothing but the pod security docs/deploy.md names).

A command seat's jail is built as a run builds it: the image's interpreter (`/opt/rollout/bin/python`, a
virtual environment where the shipped environments are installed non-editable) found with
`rollout.sandbox.programs`, so the graders' answers sit in the site-packages it runs on. Each attack is a
shell command that exits 0 only if it got through; the harmful ones (a fork bomb, a 10 GB write, a signal to a
process outside) run only once a probe from inside showed its own PID namespace and rlimits in force. What
they aim at exists outside the jail (the answers, a 0600 file in the data directory, a listening port, a live
process), and those that need no more than that get through when run outside the jail first. Prints one JSON
line: each attack's verdict ("blocked", "through" or "skipped"); exits 1 unless every attack was blocked and
the process outside outlived them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from rollout.sandbox.jail import Jail
from rollout.sandbox.programs import program_install
from rollout.sandbox.workspace import Workspace
from rollout.security.isolation import JailLimits, MiB

VENV = Path(sys.prefix)
SITE = VENV / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
LIMITS = JailLimits(processes=64, memory_bytes=256 * MiB, file_bytes=64 * MiB, disk_bytes=64 * MiB)


def attacks(secret: Path, port: int, victim: int) -> list[tuple[str, str]]:
    answers = sorted((SITE / "coding" / "grader" / "dataset").glob("*/solution/*.py"))
    assert answers, f"no grader answers under {SITE}: the image installs `coding` non-editable"
    return [
        ("read-the-graders-answers", f"cat {answers[0]}"),
        ("import-the-grader", f"{VENV}/bin/python -c 'import coding.grader'"),
        ("read-the-data-directory", f"cat {secret}"),
        ("list-the-data-directory", f"ls {secret.parent}"),
        ("connect-a-listener-outside", f"exec 3<>/dev/tcp/127.0.0.1/{port}"),
        ("see-a-process-outside", f"test -e /proc/{victim}/cmdline"),
        ("write-the-virtual-environment", f"touch {VENV}/bin/red-team-was-here"),
        ("write-the-system", "touch /usr/red-team-was-here"),
        ("signal-a-process-outside", f"kill -TERM {victim}"),
        (
            "fork-bomb",
            "bomb() { bomb | bomb & }; bomb; SECONDS=0; while [ $SECONDS -lt 2 ]; do :; done; "
            "set -- /proc/[0-9]*; [ $# -gt 1000 ]",
        ),
        ("write-10-gb", "head -c 10G /dev/zero > big; status=$?; rm -f big; exit $status"),
    ]


HARMFUL = {"signal-a-process-outside", "fork-bomb", "write-10-gb"}
# Attacks that get through from outside the jail, as this user: run there first, so that "blocked" means the
# jail refused them (the others are refused outside too, by the file system's owners, or would do harm).
CONTROLLED = {
    "read-the-graders-answers",
    "import-the-grader",
    "read-the-data-directory",
    "list-the-data-directory",
    "connect-a-listener-outside",
    "see-a-process-outside",
}


def in_force(probe: str) -> bool:
    found = dict(re.findall(r"(\w+)=(\S*)", probe))
    return (
        found.get("pid", "").isdigit()
        and int(found["pid"]) < 10
        and found.get("nproc") not in (None, "", "unlimited")
        and found.get("fsize") not in (None, "", "unlimited")
    )


def _outside(command: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["bash", "-c", command], capture_output=True, check=False)


async def main() -> int:
    data = Path(os.environ.get("ROLLOUT_DATA_DIR", "/data"))
    secret = data / "image-check-secret.key"
    secret.write_text("not for the policy\n")
    secret.chmod(0o600)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    victim = await asyncio.create_subprocess_exec("sleep", "600")
    install = program_install("python", str(VENV / "bin"), packages=("httpx",))
    workspace = Workspace(
        Path(tempfile.mkdtemp(dir=data, prefix="image-check-")) / "work",
        disk_bytes=LIMITS.disk_bytes,
        owner=os.getuid(),
    )
    jail = Jail(workspace, limits=LIMITS, readable=install.readable, masked=install.masked)
    verdicts: dict[str, str] = {}
    try:
        seat_python = await jail.run(
            [f"{VENV}/bin/python", "-c", "import httpx; print('ok')"], timeout_s=60, max_output_bytes=4096
        )
        assert seat_python.output.strip() == "ok", (
            f"the seat's interpreter does not run: {seat_python.output}"
        )
        probe = await jail.run(
            ["bash", "-c", 'echo "pid=$$ nproc=$(ulimit -u) fsize=$(ulimit -f)"'],
            timeout_s=30,
            max_output_bytes=4096,
        )
        verdicts["in-force"] = "yes" if in_force(probe.output) else f"no: {probe.output.strip()}"
        for name, command in attacks(secret, port, victim.pid):
            if name in CONTROLLED and (await asyncio.to_thread(_outside, command)).returncode:
                verdicts[name] = "fails even outside the jail: the check proves nothing"
                continue
            if name in HARMFUL and verdicts["in-force"] != "yes":
                verdicts[name] = "skipped"
                continue
            done = await jail.run(["bash", "-c", command], timeout_s=60, max_output_bytes=4096)
            verdicts[name] = "through" if done.exit_code == 0 else "blocked"
        verdicts["victim-alive"] = "yes" if victim.returncode is None else "no"
    finally:
        await jail.close()
        workspace.close()
        with contextlib.suppress(ProcessLookupError):
            victim.kill()
        listener.close()
        secret.unlink()
    print(json.dumps(verdicts))
    held = verdicts.pop("in-force") == "yes" and verdicts.pop("victim-alive") == "yes"
    return 0 if held and all(verdict == "blocked" for verdict in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
