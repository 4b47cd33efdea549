"""Jails: every command an agent chooses (a shell tool's command, a command seat's whole process tree) runs in
one.

Contract:
- `Jail(workspace, limits=, readable=, masked=, isolation=)` runs commands (`run`) whose only writable place
  is the workspace's folder, seen inside at `INSIDE` (`/sandbox`): their HOME, and their current directory (or
  a folder in it that `run` names).
- Isolation `bwrap` (bubblewrap): each command is a bubblewrap of its own, with new user, mount, PID, IPC,
  UTS, cgroup and network namespaces (no network: only a loopback of its own), no capabilities and no further
  user namespaces. Its root is read-only: the system directories (`/usr` and the links into it), a few files
  of `/etc` (`ETC_FILES`, copied: rollout.sandbox.jail_etc; none that could hold a credential), the `readable`
  paths (read-only, at the same path), private `/proc`, `/dev` (read-only but for a capped `/dev/shm`) and
  `/tmp` (a tmpfs of `limits.tmp_bytes`). A `masked` folder inside a readable one is empty there but for the
  readable paths within it (a Python install's `site-packages`: rollout.sandbox.programs). The host's other
  files, its processes, their environments and command lines, and the data directory do not exist there. Its
  environment is `env` over `BASE_ENV`: nothing of the host's is inherited.
- A command enters its cgroup, rlimits and uid through small programs before it (rollout.sandbox.entry), so
  this process is not forked for each command; where they are missing, in a `preexec_fn`. The variables of
  its environment that change how a program starts (`LD_PRELOAD`, ...) reach it only inside the jail, never
  the programs (bubblewrap included) that run on the host before it.
- Run by root, a jail's processes run as `JAIL_UID` (nobody; RLIMIT_NPROC then holds for them) inside a cgroup
  of the jail capping its processes and memory (rollout.sandbox.limits); run by another user, as that user,
  with the rlimits, and a watchdog (rollout.sandbox.watchdog) that kills a command whose processes hold more
  than `limits.memory_bytes` together or that grows the workspace past `limits.disk_bytes` (its output says
  so). The watchdog looks every 0.1 s, so a command it kills may leave the workspace over its cap; the next
  command that starts over the cap may write no file data (RLIMIT_FSIZE of one byte: it may delete, and its
  output says why), so that commands in turn cannot ratchet the workspace up by an overshoot each.
- A command's time limit, or `kill_all()`, kills its whole tree: bubblewrap's PID namespace ends with it,
  daemons and `setsid` children included. A command that ends takes its background children with it.
- `spawn` starts a command with pipes on its stdin and stdout instead (a conversation with a jailed process,
  as a grader holds with the code it grades), under the same rules but the watchdog (its caller bounds it);
  `kill_all()` kills it too.
- Output: stdout and stderr merged, at most `max_output_bytes` kept (head or tail,
  rollout.security.bounded_process).
- Isolation `none` runs each command straight from this process, in the workspace, with the same environment
  rules and rlimits but no namespaces: only when a person chose it (`sandbox.isolation=none`).
- `jail_problem()` says, in a sentence that says how to fix it, why bubblewrap cannot jail on this machine, or
  None; it is checked once per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from rollout.sandbox.entry import entry_argv, outside_and_inside
from rollout.sandbox.jail_etc import jail_etc
from rollout.sandbox.limits import JailCgroup, JailLimits, apply_rlimits, tasks_of_uid
from rollout.sandbox.staging import staged
from rollout.sandbox.watchdog import disk_used, guard
from rollout.sandbox.workspace import Workspace
from rollout.security.bounded_process import ProcessOutcome, run_bounded
from rollout.security.isolation import SandboxIsolation as Isolation

INSIDE = "/sandbox"
JAIL_UID = 65534  # nobody: the uid jailed processes run as when rollout runs as root
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": INSIDE,
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "TMPDIR": "/tmp",
}
# What of /etc a command may read: name resolution and the libraries' own configuration, never a credential
# (no pip.conf, npmrc or gitconfig: they can hold a registry's token).
ETC_FILES = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "passwd",
    "group",
    "hosts",
    "ssl/certs",
    "ca-certificates",
    "python3",
    "python3.11",
    "python3.13",
)
INSTALL_BWRAP = (
    "install bubblewrap (Debian and Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`), "
    "or run agents' commands unjailed with `sandbox.isolation=none` (only on a machine you would let the policy "
    "have)"
)


OVER_DISK = (
    "the working directory was over its disk cap when this command started, so it could write no file data: "
    "delete files to write again"
)


class CommandKilled(RuntimeError):
    """The command was killed by `Jail.kill_all()` (the sandbox's claim ended) before it finished."""


class JailUnavailable(RuntimeError):
    """bubblewrap cannot jail commands on this machine; the message says how to fix it."""


def _cancelling() -> bool:
    """Whether the calling task itself is being cancelled (not just a command it awaits)."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


@functools.cache
def _bwrap() -> str:
    return shutil.which("bwrap") or "bwrap"


def jail_uid() -> int:
    return JAIL_UID if os.geteuid() == 0 else os.getuid()


@functools.cache
def jail_problem() -> str | None:
    """Why bubblewrap cannot jail here (missing, or no user namespaces), or None."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"bubblewrap (`bwrap`) is not installed: {INSTALL_BWRAP}."
    probe = [bwrap, *_namespaces(), *_root_filesystem(()), "--", "/bin/true"]
    try:
        done = subprocess.run(
            probe, capture_output=True, timeout=30, env=BASE_ENV, preexec_fn=_drop_privileges, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap does not run here ({error}): {INSTALL_BWRAP}."
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        if "mount proc" in why:
            return (
                f"bubblewrap cannot mount a /proc of its own here ({why}): this is a container whose /proc is "
                "masked. Unmask it (Kubernetes: the container's `securityContext.procMount: Unmasked`, with "
                "`hostUsers: false`; Podman: `--security-opt unmask=/proc/*`; Docker: "
                '`--security-opt systempaths=unconfined`), as docs/deploy.md\'s "Pod security for the jail" '
                f"says, or {INSTALL_BWRAP.split(', or ', 1)[1]}."
            )
        return (
            f"bubblewrap cannot create namespaces here ({why}): allow unprivileged user namespaces "
            "(`sysctl kernel.unprivileged_userns_clone=1`, or in a container give it a seccomp profile that "
            f"allows them), or {INSTALL_BWRAP.split(', or ', 1)[1]}."
        )
    return None


def _drop_privileges() -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(JAIL_UID)
        os.setuid(JAIL_UID)


def _namespaces() -> list[str]:
    return [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
    ]


def _root_filesystem(
    readable: Sequence[tuple[Path, Path]], tmp_bytes: int = 64 * 1024 * 1024, masked: Sequence[Path] = ()
) -> list[str]:
    """The jail's read-only root; `readable` are (source, path): folders bound read-only at `path`, from where
    the jail's uid reaches them (rollout.sandbox.staging); `masked`, folders inside them shown empty but for
    the readable paths within."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/", top)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    argv += ["--ro-bind", str(jail_etc(ETC_FILES)), "/etc"]
    size = str(tmp_bytes)
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm"]
    argv += ["--size", size, "--tmpfs", "/tmp"]

    def hidden(path: Path) -> bool:
        return any(path.is_relative_to(folder) for folder in masked)

    for source, path in readable:  # after /tmp's tmpfs: a readable path may be under /tmp
        if not hidden(path):
            argv += ["--ro-bind", str(source), str(path)]
    shown = [path for _, path in readable if not hidden(path)]
    masks = [folder for folder in masked if any(folder.is_relative_to(path) for path in shown)]
    for folder in masks:  # an empty, read-only folder over what a bound tree holds there
        argv += ["--perms", "0755", "--size", "4096", "--tmpfs", str(folder)]
    for source, path in readable:
        if hidden(path):
            argv += ["--ro-bind", str(source), str(path)]
    for folder in masks:
        argv += ["--remount-ro", str(folder)]
    return argv


class Jail:
    def __init__(
        self,
        workspace: Workspace,
        *,
        limits: JailLimits,
        readable: Sequence[Path] = (),
        masked: Sequence[Path] = (),
        isolation: Isolation = Isolation.bwrap,
    ) -> None:
        if isolation is Isolation.bwrap and (problem := jail_problem()) is not None:
            raise JailUnavailable(problem)
        self.workspace = workspace
        self.limits = limits
        self.isolation = isolation
        self.uid = jail_uid()
        self.readable = tuple(Path(p).resolve() for p in readable)
        self.masked = tuple(Path(p).resolve() for p in masked)
        for path in self.readable:
            if isolation is Isolation.bwrap and (
                path.is_relative_to(INSIDE) or Path(INSIDE).is_relative_to(path)
            ):
                raise ValueError(f"{path} cannot be read in a jail: the jail's working directory is {INSIDE}")
        self._sources = (
            tuple(staged(p, self.uid) for p in self.readable) if isolation is Isolation.bwrap else ()
        )
        self.cgroup = JailCgroup.create(f"rollout-jail-{uuid.uuid4().hex[:12]}", limits)
        self._running: set[asyncio.Task[ProcessOutcome]] = set()
        self._spawned: list[subprocess.Popen[bytes]] = []

    @property
    def inside(self) -> str:
        """Where the workspace is, as its commands see it."""
        return INSIDE if self.isolation is Isolation.bwrap else str(self.workspace.path)

    def _argv(
        self, command: Sequence[str], cwd: str, binds: Sequence[Path] = (), inside: Mapping[str, str] = {}
    ) -> list[str]:
        """bubblewrap's argument list; `inside`: variables set only inside the jail (rollout.sandbox.entry:
        those that would change how the programs outside start)."""
        extra = [argument for path in binds for argument in ("--ro-bind", str(path), str(path))]
        extra += [argument for name, value in inside.items() for argument in ("--setenv", name, value)]
        return [
            _bwrap(),
            *_namespaces(),
            *_root_filesystem(
                list(zip(self._sources, self.readable, strict=True)), self.limits.tmp_bytes, self.masked
            ),
            *extra,
            "--bind",
            str(self.workspace.path),
            INSIDE,
            "--remount-ro",
            "/dev",
            "--remount-ro",
            "/",
            "--chdir",
            f"{INSIDE}/{cwd}" if cwd else INSIDE,
            "--",
            *command,
        ]

    def _enter(self, nproc: int, limits: JailLimits | None = None) -> None:
        """In the child, before exec: the cgroup, the rlimits, then the jail's uid (nothing but system
        calls)."""
        if self.cgroup is not None:
            self.cgroup.join()
        apply_rlimits(limits or self.limits, nproc)
        _drop_privileges()

    async def _over_disk(self) -> bool:
        """Whether the watchdog holds the disk cap (no cgroup, no tmpfs of its size) and the workspace is past
        it already: what a command the watchdog killed late left behind."""
        if self.cgroup is not None or self.workspace.quota:
            return False
        return await asyncio.to_thread(disk_used, self.workspace.path) > self.limits.disk_bytes

    def _process_limit(self) -> int:
        """RLIMIT_NPROC for the next command: what the jail's uid runs already plus the jail's share. It
        counts every task of the uid on the host, every jail's (they share it), so a fixed number would let
        other jails use it up: one episode's fork bomb, held at its own cap, would make every other jail's
        next command fail to start. With a cgroup capping the jail, its share is only a backstop (16 times
        its cap); without one, its cap."""
        share = self.limits.processes * 16 if self.cgroup is not None else self.limits.processes
        return tasks_of_uid(self.uid) + share

    async def run(
        self,
        command: Sequence[str],
        *,
        timeout_s: float,
        max_output_bytes: int,
        keep: Literal["head", "tail"] = "head",
        env: Mapping[str, str] = {},
        cwd: str = "",
        binds: Sequence[Path] = (),
    ) -> ProcessOutcome:
        """Run `command` in the jail, in `cwd` (a folder of the workspace; its top by default); see the
        module's contract. `binds`: more paths this command alone reads, read-only at the same path (the
        caller makes them reachable by the jail's uid). Cancelling the caller kills the command."""
        if Path(cwd).is_absolute() or ".." in Path(cwd).parts:
            raise ValueError(f"a jailed command starts inside its workspace, not in {cwd!r}")
        environment = {**BASE_ENV, "HOME": self.inside, **env}
        outside, inside = outside_and_inside(environment)
        bwrap = self.isolation is Isolation.bwrap
        roots: set[int] = set()
        over = await self._over_disk()
        limits = replace(self.limits, file_bytes=1) if over else self.limits
        argv = self._argv(command, cwd, binds, inside) if bwrap else list(command)
        nproc = self._process_limit()
        cgroup_procs = [folder / "cgroup.procs" for folder in self.cgroup.folders] if self.cgroup else []
        entry = entry_argv(
            limits, nproc=nproc, cgroup_procs=cgroup_procs, uid=JAIL_UID if os.geteuid() == 0 else None
        )
        if not bwrap and inside:  # unjailed, they reach only the command, after the uid is dropped
            entry, outside = None, environment
        running = asyncio.create_task(
            run_bounded(
                [*entry, *argv] if entry is not None else argv,
                cwd="/" if bwrap else self.workspace.path / cwd,  # bubblewrap enters the workspace itself
                env=outside if bwrap or entry is not None else environment,
                inherit=False,
                timeout_s=timeout_s,
                max_output_bytes=max_output_bytes,
                keep=keep,
                # Without the entry programs, Python forks this whole process to enter them in the child.
                preexec_fn=functools.partial(self._enter, nproc, limits) if entry is None else None,
                started=roots.add,
            )
        )
        self._running.add(running)
        watching = self._watch(roots)
        try:
            outcome = await asyncio.shield(running)
            if watching is not None and watching.done():
                outcome = replace(outcome, output=f"{outcome.output}\n{watching.result()}")
            if over:
                outcome = replace(outcome, output=f"{outcome.output}\n{OVER_DISK}")
            return outcome
        except asyncio.CancelledError:
            if running.cancelled() and not _cancelling():
                raise CommandKilled("the command was killed: its sandbox's claim ended") from None
            raise
        finally:
            if not running.done():
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
            if watching is not None and not watching.done():
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
            self._running.discard(running)

    def _watch(self, roots: set[int]) -> asyncio.Task[str] | None:
        """Without a cgroup (not root), a watchdog holds the jail's memory cap, and its disk cap where the
        workspace is no tmpfs of that size (rollout.sandbox.watchdog)."""
        if self.cgroup is not None:
            return None
        folder = None if self.workspace.quota else self.workspace.path
        return asyncio.create_task(
            guard(
                roots, folder=folder, disk_bytes=self.limits.disk_bytes, memory_bytes=self.limits.memory_bytes
            )
        )

    def spawn(
        self, command: Sequence[str], *, env: Mapping[str, str] = {}, cwd: str = ""
    ) -> subprocess.Popen[bytes]:
        """Start `command` in the jail with pipes on its stdin and stdout (its stderr is dropped), for a
        conversation with a jailed process (a grader's, say) rather than one command's output. The caller
        reads it and waits for it, or kills it (its whole tree goes with bubblewrap); `kill_all()` and
        `close()` kill it too."""
        if Path(cwd).is_absolute() or ".." in Path(cwd).parts:
            raise ValueError(f"a jailed command starts inside its workspace, not in {cwd!r}")
        bwrap = self.isolation is Isolation.bwrap
        environment = {**BASE_ENV, "HOME": self.inside, **env}
        outside, inside = outside_and_inside(environment)
        process = subprocess.Popen(
            self._argv(command, cwd, (), inside) if bwrap else list(command),
            cwd="/" if bwrap else self.workspace.path / cwd,
            env=outside if bwrap else environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=functools.partial(self._enter, self._process_limit()),
        )
        self._spawned.append(process)
        return process

    def _kill_spawned(self) -> None:
        for process in self._spawned:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, 9)
                process.wait()
        self._spawned.clear()

    async def kill_all(self) -> None:
        """Kill every command running in the jail, and whatever it started, and wait until they are gone."""
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self._kill_spawned()
        if self.cgroup is not None:
            self.cgroup.kill()

    async def close(self) -> None:
        await self.kill_all()
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
