"""The jail every agent's command runs in (bubblewrap, real processes): what a command can see, write and
reach, its limits, and that its whole tree dies with its time limit and with the sandbox's reset. The attacks
that would harm this machine if the jail failed (a fork bomb, a large write) run only after the same test has
seen, from inside, the PID namespace and the limits in force."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from rollout.config import SandboxIsolation
from rollout.sandbox.jail import Jail, jail_problem, jail_uid
from rollout.sandbox.shell import ShellWorld
from rollout.sandbox.workspace import Workspace
from rollout.security.isolation import JailLimits, MiB

SMALL = JailLimits(
    processes=48, memory_bytes=256 * MiB, file_bytes=8 * MiB, disk_bytes=16 * MiB, tmp_bytes=4 * MiB
)


def test_this_machine_can_jail() -> None:
    assert jail_problem() is None, (
        "bubblewrap must be installed and able to create namespaces (.ci/run installs it)"
    )


async def _sh(world: ShellWorld, command: str, timeout_s: float = 10) -> dict[str, object]:
    return await world.act(0, {"command": command, "timeout_s": timeout_s})


async def test_a_command_sees_its_workspace_and_nothing_of_the_host(tmp_path: Path) -> None:
    secret = tmp_path / "operator.key"
    secret.write_text("the-host-secret")
    os.environ["ROLLOUT_JAIL_TEST_MARKER"] = marker = uuid.uuid4().hex
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    world = ShellWorld(tmp_path / "box", seats=1, limits=SMALL)
    try:
        seen = await _sh(
            world,
            f"cat {secret} 2>&1; ls {tmp_path} 2>&1; ls /proc | grep -c '^[0-9]'; "
            "cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c ROLLOUT_JAIL[_]TEST; "
            "touch /usr/x /etc/x /x 2>&1 | grep -c 'Read-only'; id -u; pwd; echo $HOME; "
            f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo connected || echo refused; "
            "ls /etc | grep -c -x 'pip.conf\\|npmrc\\|gitconfig\\|shadow'",
        )
        lines = str(seen["output"]).splitlines()
        assert "the-host-secret" not in str(seen["output"]) and "No such file" in lines[0]
        processes, marked, read_only, uid, pwd, home, refused, credentials = lines[-8:]
        assert int(processes) <= 4, "its own PID namespace: bubblewrap, bash and the pipeline"
        assert marked == "0", "no process of the host, and none of its environment, is visible"
        assert read_only == "3", "the root, /usr and /etc are read-only"
        assert uid == ("65534" if os.geteuid() == 0 else str(os.getuid()))
        assert (pwd, home) == ("/sandbox", "/sandbox")
        assert refused == "refused", "no network: the host's loopback is not its loopback"
        assert credentials == "0"
        assert marker not in str(seen["output"])
        made = await _sh(world, "echo kept > note && cat note")
        assert made["output"] == "kept\n" and (world.workdir / "note").read_text() == "kept\n"
    finally:
        listener.close()
        os.environ.pop("ROLLOUT_JAIL_TEST_MARKER")
        await world.close()


async def _on_host(tag: str) -> str:
    """The host's processes whose command line starts with this test's sleeper tag."""
    found = await asyncio.create_subprocess_exec(
        "pgrep", "-f", f"^sleep-{tag}", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await found.communicate()
    return out.decode()


async def test_limits_hold_and_a_commands_whole_tree_dies_with_it(tmp_path: Path) -> None:
    world = ShellWorld(tmp_path / "box", seats=1, limits=SMALL)
    tag = uuid.uuid4().hex[:8]
    try:
        # First, from inside: its own PID namespace, and the limits in force.
        inside = await _sh(
            world, "echo $$; ulimit -u; ulimit -f; ulimit -v; df -k --output=size . | tail -1; id -u; id -G"
        )
        pid, processes, file_blocks, address_kib, disk_kib, uid, *groups = str(inside["output"]).split()
        assert int(pid) < 10, "bash is one of the first processes of a PID namespace of its own"
        assert int(uid) == jail_uid() and groups in ([str(jail_uid())], ["65534"]), "its uid, no other groups"
        assert int(processes) >= SMALL.processes and int(file_blocks) * 1024 == SMALL.file_bytes
        assert int(address_kib) * 1024 == SMALL.address_space_bytes
        if os.geteuid() == 0:
            assert int(disk_kib) * 1024 == SMALL.disk_bytes, "the workspace is a tmpfs of its quota"
            assert world.jail.cgroup is not None, "root caps a jail's processes and memory with a cgroup"
            held = asyncio.ensure_future(_sh(world, "sleep 1"))
            await asyncio.sleep(0.5)
            assert world.jail.cgroup.pids(), "the command's processes are in the jail's cgroup"
            await held

        # Now the attacks: a fork bomb, a write far past the quota, a setsid daemon.
        bomb = await _sh(world, ":(){ :|:& };: ; sleep 1; echo survived", timeout_s=5)
        assert (await asyncio.to_thread(subprocess.run, ["true"], check=False)).returncode == 0, (
            "the host still forks"
        )
        assert "survived" in str(bomb["output"]) or bomb["timed_out"]
        write = await _sh(
            world, "for i in $(seq 40); do head -c 8M /dev/zero > big$i || break; done; du -sk ."
        )
        used_kib = int(str(write["output"]).split()[-2])
        assert used_kib * 1024 <= SMALL.disk_bytes + MiB, "writing past the quota fails"

        def sleeper(seconds: int) -> str:  # a sleep whose command line carries the tag
            return f"bash -c 'exec -a sleep-{tag} sleep {seconds}'"

        started = await _sh(
            world, f"setsid {sleeper(1000)} & ({sleeper(1001)} &); sleep 0.2; pgrep -c -f ^sleep-{tag}"
        )
        assert started["output"] == "2\n", "both daemons ran (inside the jail)"
        slow = await _sh(world, f"setsid {sleeper(1002)} & sleep 30", timeout_s=0.5)
        assert slow["timed_out"]
        await asyncio.sleep(0.2)
        assert await _on_host(tag) == "", (
            "a command's daemons and setsid children end with it, and at its time limit"
        )

        # A reset kills a command still running and clears a folder the jail locked.
        running = asyncio.ensure_future(
            _sh(world, f"mkdir -p locked/deep && chmod 000 locked; {sleeper(1003)}")
        )
        await asyncio.sleep(0.5)
        await world.reset()
        with pytest.raises(RuntimeError, match="killed"):
            await running
        assert list(world.workdir.iterdir()) == []
        assert await _on_host(tag) == ""
    finally:
        await world.close()


async def test_what_other_jails_run_under_the_shared_uid_never_uses_up_a_jails_process_budget(
    tmp_path: Path,
) -> None:
    # Every jail runs under one uid, and RLIMIT_NPROC counts that uid's tasks on the whole host: another
    # episode's fork bomb, held at its own jail's cap, must not leave this jail unable to start a command.
    tiny = JailLimits(processes=8, memory_bytes=256 * MiB)
    world = ShellWorld(tmp_path / "box", seats=1, limits=tiny)
    others: list[subprocess.Popen[bytes]] = []
    try:
        assert (await _sh(world, "echo first"))["output"] == "first\n"
        uid = jail_uid()
        # More of the uid's tasks than this jail's whole share (16 x its cap with a cgroup, its cap without).
        for _ in range(tiny.processes * 16 + 16):
            others.append(
                await asyncio.to_thread(
                    subprocess.Popen, ["sleep", "60"], user=uid if os.geteuid() == 0 else None
                )
            )
        ran = await _sh(world, "echo $(echo nested) still")
        assert ran["output"] == "nested still\n", ran
    finally:
        for other in others:
            other.kill()
            other.wait()
        await world.close()


async def test_unjailed_only_when_chosen(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "plain", disk_bytes=SMALL.disk_bytes, owner=jail_uid())
    jail = Jail(workspace, limits=SMALL, isolation=SandboxIsolation.none)
    try:
        done = await jail.run(["bash", "-c", "ls /var; pwd"], timeout_s=5, max_output_bytes=1000)
        assert "lib" in done.output, "isolation=none runs on the host as it is"
        assert done.output.splitlines()[-1] == str(workspace.path)
    finally:
        await jail.close()
        workspace.close()


LOADED = """#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void loaded(void) {
    int fd = open("MARKER", O_CREAT | O_WRONLY | O_APPEND, 0666);
    if (fd >= 0) { write(fd, "x", 1); close(fd); }
}
"""


@pytest.fixture
def loaded_library(tmp_path: Path) -> tuple[Path, Path]:
    """A library that marks a file on the host when it is loaded, in a folder anyone may write: (library,
    marker)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    # Every folder above it can be passed by anyone (another test's service may have opened some already):
    # unjailed, the command itself, run as whichever user, loads the library once.
    for folder in (tmp_path, *tmp_path.parents):
        if not folder.stat().st_mode & stat.S_IXOTH:
            folder.chmod(folder.stat().st_mode | stat.S_IXOTH)
    marker = shared / "loaded-outside"
    source = shared / "loaded.c"
    source.write_text(LOADED.replace("MARKER", str(marker)))
    library = shared / "loaded.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    library.chmod(0o755)
    return library, marker


@pytest.mark.parametrize("isolation", [SandboxIsolation.bwrap, SandboxIsolation.none])
async def test_a_loader_variable_reaches_the_command_and_nothing_that_runs_before_it(
    tmp_path: Path, isolation: SandboxIsolation, loaded_library: tuple[Path, Path]
) -> None:
    """An order's environment is the claimant's: `LD_PRELOAD` naming a library it left on the host would run
    its code in whatever the environment reaches on the host. The command sees the variable (inside the jail,
    where the library's path is not), and nothing that runs before it (as root, where rollout is) loads it."""
    library, marker = loaded_library
    workspace = Workspace(tmp_path / "ws", disk_bytes=SMALL.disk_bytes, owner=jail_uid())
    jail = Jail(workspace, limits=SMALL, isolation=isolation)
    try:
        done = await jail.run(
            ["sh", "-c", "echo preload=$LD_PRELOAD"],
            env={"LD_PRELOAD": str(library)},
            timeout_s=30,
            max_output_bytes=4096,
        )
    finally:
        await jail.close()
        workspace.close()
    assert f"preload={library}" in done.output, done.output
    loads = marker.read_text() if marker.exists() else ""
    # Unjailed, the command's own `sh` runs here and loads it once; nothing that runs before it does.
    assert loads == ("" if isolation is SandboxIsolation.bwrap else "x"), loads
