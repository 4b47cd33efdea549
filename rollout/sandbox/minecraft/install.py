"""Install the Minecraft world's Node packages: pinned, under the data directory, once.

Contract:
- `ensure_installed(home)` makes `home` hold the server and bots exactly as `package-lock.json` (shipped
  beside this module) pins them, and a Node 22 or newer to run them: the machine's own `node` when it is new
  enough, else the Node 22 build the npm registry carries as a package (`node-{os}-{arch}`), installed into
  `home/node`. It answers an `Installation` (the Node to run, the packages' directory). An installation that
  matches the lock and the Node is reused without touching the network; one that does not is redone from
  scratch.
- Concurrent installers (several sandbox processes on one machine) serialise on a file lock: one installs, the
  others then reuse it.
- Without `npm`, or when the registry cannot be reached, it raises `MinecraftInstallError` saying what to do.
- `minecraft_home(data_path)` is where a data directory keeps it (`tools/minecraft`); `ROLLOUT_MINECRAFT_HOME`
  overrides it (tests share one installation across their data directories).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rollout.sandbox.world import SandboxSetupError

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
NODE_VERSION = "22.23.5"  # mineflayer 4.39 needs Node 22
MIN_NODE_MAJOR = 22
INSTALL_TIMEOUT_S = 900
HOME_VARIABLE = "ROLLOUT_MINECRAFT_HOME"


class MinecraftInstallError(SandboxSetupError):
    """The Minecraft packages could not be installed."""


@dataclass(frozen=True)
class Installation:
    home: Path
    node: Path

    @property
    def sidecar(self) -> Path:
        return HERE / "sidecar.mjs"


def minecraft_home(data_path: Path | None = None) -> Path:
    """Where the packages live: `ROLLOUT_MINECRAFT_HOME`, else under `data_path` (by default the data
    directory the configuration defaults to; `rollout sandbox serve` sets the variable from its settings)."""
    if os.environ.get(HOME_VARIABLE):
        return Path(os.environ[HOME_VARIABLE])
    if data_path is None:
        data_path = Path(os.environ.get("ROLLOUT_DATA_DIR") or Path.home() / ".local" / "share" / "rollout")
    return data_path / "tools" / "minecraft"


def _pinned(node: Path) -> str:
    """What an installation was made for: the lock's contents and the Node that runs it."""
    lock = (HERE / "package.json").read_bytes() + (HERE / "package-lock.json").read_bytes()
    return f"{hashlib.sha256(lock).hexdigest()[:16]} {node} v{_node_major(str(node))}"


def _node_major(node: str) -> int:
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=True)
        return int(version.stdout.strip().lstrip("v").split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


def _node_package() -> str:
    system = {"Linux": "linux", "Darwin": "darwin"}.get(platform.system())
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    if system is None or machine is None:
        raise MinecraftInstallError(
            f"no Node {MIN_NODE_MAJOR} package for {platform.system()} {platform.machine()}: install Node "
            f"{MIN_NODE_MAJOR} or newer yourself and put it on PATH, then try again."
        )
    return f"node-{system}-{machine}@{NODE_VERSION}"


def _npm(arguments: list[str], cwd: Path, what: str) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise MinecraftInstallError(
            "minecraft sandboxes need npm to install their server and bots, and npm is not on PATH: install "
            "Node.js with npm (e.g. `apt-get install nodejs npm`), then run `rollout sandbox install minecraft`."
        )
    command = [npm, *arguments, "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=True
        )
    except subprocess.CalledProcessError as error:
        detail = (error.stderr or error.stdout or "").strip().splitlines()[-6:]
        raise MinecraftInstallError(
            f"npm could not install {what} into {cwd}: {' / '.join(detail) or f'exit {error.returncode}'}. "
            "Check that this machine reaches the npm registry (`npm ping`; set another one with `npm config set "
            "registry URL`), then run `rollout sandbox install minecraft` again."
        ) from error
    except subprocess.TimeoutExpired as error:
        raise MinecraftInstallError(
            f"npm took over {INSTALL_TIMEOUT_S}s installing {what} into {cwd}: is the registry reachable? Run "
            "`rollout sandbox install minecraft` again once it is."
        ) from error


def _node(home: Path) -> Path:
    system_node = shutil.which("node")
    if system_node and _node_major(system_node) >= MIN_NODE_MAJOR:
        return Path(system_node)
    packaged = home / "node" / "node_modules" / ".bin" / "node"
    if _node_major(str(packaged)) >= MIN_NODE_MAJOR:
        return packaged
    log.info("installing Node %s from the npm registry into %s", NODE_VERSION, home / "node")
    (home / "node").mkdir(parents=True, exist_ok=True)
    _npm(["install", "--prefix", str(home / "node"), "--no-save", _node_package()], home / "node", "Node 22")
    if _node_major(str(packaged)) < MIN_NODE_MAJOR:
        raise MinecraftInstallError(
            f"the Node installed into {home / 'node'} does not run: remove it and retry"
        )
    return packaged


def ensure_installed(home: Path) -> Installation:
    home.mkdir(parents=True, exist_ok=True)
    with (home.parent / f".{home.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, by this process or by its death
        node = _node(home)
        stamp = home / "installed"
        pinned = _pinned(node)
        if stamp.exists() and stamp.read_text() == pinned and (home / "node_modules").is_dir():
            return Installation(home, node)
        log.info("installing the Minecraft server and bots (npm, ~750 MB) into %s", home)
        stamp.unlink(missing_ok=True)
        shutil.rmtree(home / "node_modules", ignore_errors=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(HERE / name, home / name)
        _npm(["ci", "--omit=dev"], home, "the Minecraft server and bots")
        stamp.write_text(pinned)
        log.info("installed the Minecraft server and bots into %s", home)
        return Installation(home, node)
