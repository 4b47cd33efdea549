"""Folders a jail binds, made reachable by the jail's uid: bubblewrap, run as that uid, must walk to each one.

Contract:
- `reachable(path, uid)` is True when `uid` can search every folder from `/` down to `path` (or owns it), and
  read `path` itself when it is a file.
- `staged(path, uid, writable=)` is a path to the same folder (or file) that `uid` can reach: `path` itself
  when it is reachable already; else (run by root: a test's temporary folder, an interpreter under /root) a
  bind mount of it under `STAGE_ROOT` (searchable, not listable, by others), read-only unless `writable`. A
  path is staged once per machine (a second call finds the mount); `unstage` removes one.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import stat
from pathlib import Path

from rollout.sandbox.private_root import private_root

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 0x1, 0x20, 0x1000, 0x4000
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def stage_root() -> Path:
    return private_root() / "staged"


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mounts_at(path: Path) -> list[str]:
    """The filesystem types mounted at `path`, bottom first (/proc/self/mountinfo: a bind mount of a folder of
    the same filesystem is a mount too, which `os.path.ismount` does not see)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4] == str(path):
            found.append(fields[fields.index("-") + 1])
    return found


def reachable(path: Path, uid: int) -> bool:
    for folder in (*reversed(path.parents), path):
        try:
            info = folder.stat()
        except OSError:
            return False
        if info.st_uid == uid:
            continue
        # A folder must be searchable by others; a file (the path itself) readable by them.
        needed = stat.S_IXOTH if stat.S_ISDIR(info.st_mode) else stat.S_IROTH
        if not info.st_mode & needed:
            return False
    return True


def staged(path: Path, uid: int, *, writable: bool = False) -> Path:
    path = path.resolve()
    if reachable(path, uid):
        return path
    if os.geteuid() != 0:
        raise PermissionError(f"{path} is not reachable by uid {uid}")
    root = stage_root()
    for folder in (*reversed(root.parents), root):
        if not folder.exists():
            with contextlib.suppress(FileExistsError):  # made by another process since
                folder.mkdir(mode=0o711)
    kind = "rw" if writable else "ro"
    target = root / f"{hashlib.sha256(str(path).encode()).hexdigest()[:16]}-{kind}"
    if path.is_dir():
        target.mkdir(mode=0o755, exist_ok=True)
    else:
        target.touch(mode=0o644, exist_ok=True)  # a file is bound onto a file
    if not mounts_at(target):
        _check(
            _libc.mount(str(path).encode(), str(target).encode(), None, MS_BIND | MS_REC, None),
            f"binding {path}",
        )
        if not writable:
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY
            _check(_libc.mount(None, str(target).encode(), None, flags, None), f"making {target} read-only")
    return target


def unstage(path: Path) -> None:
    with contextlib.suppress(OSError):
        if stage_root() in path.parents and mounts_at(path):
            _check(_libc.umount2(str(path).encode(), MNT_DETACH), f"unmounting {path}")
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
