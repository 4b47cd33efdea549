"""A jail run by a user without root, as many run rollout: no cgroup and no tmpfs hold its caps, so the
watchdog does (rollout.sandbox.watchdog). The test runs rollout itself as `nobody` (its interpreter and code
staged where that user reaches them) and attacks as a policy would: a loop of 16 MiB files that would fill the
disk under Postgres, then processes that together hold more memory than the jail's cap. Each is killed, says
why, and leaves the workspace near its cap rather than the gigabytes it asked for; a command may still clean
up after itself. The jail itself (namespaces, no network) is shown in force first."""

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
from rollout.isolation import JailLimits, MiB
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
    report["clean"] = await run("rm -f f*; echo cleaned")
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
    assert report["clean"] == [0, "cleaned\n"], "a command over nothing may delete what the last one left"

    memory_code, memory = report["memory"]
    assert memory_code != 0 and "survived" not in memory, memory
    assert "past their cap of 256 MiB" in memory, memory
