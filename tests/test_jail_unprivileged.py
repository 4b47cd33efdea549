"""A jail run by a user without root, as many run rollout: no cgroup and no tmpfs hold its caps, so the
watchdog does (rollout.sandbox.watchdog). The test runs rollout itself as `nobody` (its interpreter and code
staged where that user reaches them) and attacks as a policy would: a loop of 16 MiB files that would fill the
disk under Postgres, then processes that together hold more memory than the jail's cap. Each is killed, says
why, and leaves the workspace near its cap rather than the gigabytes it asked for; the next command cannot
add to what is over the cap (no ratchet, one overshoot per command), but may still clean up after it; files
deleted but held open count too. The jail itself (namespaces, no network) is shown in force first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

import rollout
from rollout.sandbox.staging import staged

NOBODY = 65534
MiB = 1024 * 1024
DISK_CAP = 32 * MiB
SLACK = 512 * MiB  # what one look of the watchdog (0.1 s) lets a command write at this machine's disk speed
ASKED = 200 * 16 * MiB  # what the loop below would write unchecked: 3.2 GB

ATTACKS = r"""
import asyncio, json, os, sys
from pathlib import Path
from rollout.security.isolation import JailLimits, MiB
from rollout.sandbox.jail import Jail
from rollout.sandbox.watchdog import disk_used
from rollout.sandbox.workspace import Workspace

async def main() -> None:
    limits = JailLimits(disk_bytes=32 * MiB, memory_bytes=256 * MiB, file_bytes=16 * MiB)
    workspace = Workspace(Path(sys.argv[1]) / "ws", disk_bytes=limits.disk_bytes, owner=os.getuid())
    jail = Jail(workspace, limits=limits)
    report = {"uid": os.getuid(), "cgroup": jail.cgroup is not None, "quota": workspace.quota}

    async def run(script: str) -> list:
        done = await jail.run(["sh", "-c", script], timeout_s=120, max_output_bytes=4096)
        return [done.exit_code, done.output[-400:]]

    report["jailed"] = await run("cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /root 2>&1 | head -1")
    report["fill"] = await run(
        "i=0; while [ $i -lt 200 ]; do head -c 16M /dev/zero > f$i; i=$((i+1)); done; echo filled"
    )
    report["used"] = disk_used(workspace.path)
    report["again"] = await run("head -c 16M /dev/zero > again && echo wrote")
    report["used_again"] = disk_used(workspace.path)
    report["clean"] = await run("rm -f f* again; echo cleaned")
    report["after"] = await run("head -c 1M /dev/zero > small && echo wrote")
    report["hidden"] = await run(
        "python3 -c 'import os, time\n"
        "held = []\n"
        "for i in range(12):\n"
        "    f = open(f\"h{i}\", \"wb\"); os.unlink(f\"h{i}\"); f.write(bytes(15 << 20)); f.flush(); held.append(f)\n"
        "time.sleep(5)\n"
        "print(\"hid\")'"
    )
    report["memory"] = await run(
        "for i in 1 2 3 4 5 6; do python3 -c 'b = bytearray(100 << 20); import time; time.sleep(20)' & done; "
        "wait; echo survived"
    )
    await jail.close()
    workspace.clear()
    workspace.close()
    print(json.dumps(report))

asyncio.run(main())
"""


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.mark.timeout(300)
def test_a_jail_without_root_holds_its_disk_and_memory_caps() -> None:
    base = staged(Path(sys.base_prefix), NOBODY)  # its libpython too, which the interpreter finds by LD path
    python = base / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    code = staged(Path(rollout.__file__).parents[1], NOBODY)
    packages = staged(Path(sysconfig.get_paths()["purelib"]), NOBODY)
    home = Path(tempfile.mkdtemp(prefix="rollout-unprivileged-"))
    os.chown(home, NOBODY, NOBODY)
    try:
        done = subprocess.run(
            [str(python), "-c", ATTACKS, str(home)],
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(home),
                "TMPDIR": str(home),
                "PYTHONPATH": f"{code}:{packages}",
                "LD_LIBRARY_PATH": str(base / "lib"),
            },
            preexec_fn=_as_nobody,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert report["uid"] == NOBODY and not report["cgroup"] and not report["quota"], report
    jailed_code, jailed = report["jailed"]
    assert jailed_code == 0 and "--chdir /sandbox" in jailed, jailed  # PID 1 is the jail's own bubblewrap
    assert "No such file or directory" in jailed, "the host's /root is not in the jail"

    fill_code, fill = report["fill"]
    assert fill_code != 0 and "filled" not in fill, fill
    assert "past its cap of 32 MiB" in fill, fill
    assert report["used"] < DISK_CAP + SLACK < ASKED, f"{report['used'] // MiB} MiB stayed in the workspace"
    again_code, again = report["again"]
    assert again_code != 0 and "wrote" not in again and "could write no file data" in again, again
    assert report["used_again"] <= report["used"] + MiB, "a second command over the cap added nothing to it"
    clean_code, clean = report["clean"]
    assert clean_code == 0 and clean.startswith("cleaned\n"), "a command over its cap may delete what is left"
    assert report["after"] == [0, "wrote\n"], "back under the cap, commands write again"

    hidden_code, hidden = report["hidden"]
    assert hidden_code != 0 and "hid" not in hidden, "files deleted but held open count against the cap"
    assert "past its cap of 32 MiB" in hidden, hidden

    memory_code, memory = report["memory"]
    assert memory_code != 0 and "survived" not in memory, memory
    assert "past their cap of 256 MiB" in memory, memory
