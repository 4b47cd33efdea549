"""A jail's working directory on the host: the one place its commands may write, capped in size where it can
be.

Contract:
- `Workspace(folder, disk_bytes, owner)` makes `folder` for a jail whose uid is `owner`; `path` is where its
  files are on the host: `folder` itself, or where it is staged for `owner` to reach
  (rollout.sandbox.staging). Run by root, it mounts a tmpfs of `disk_bytes` at `path` (`quota` is True):
  writing past it fails with "No space left on device", and nothing the jail writes reaches the host's disk.
  Elsewhere it is a plain folder and `quota` is False (only the per-file size limit holds).
- `clear()` leaves it empty whatever the jail did to it (`chmod 000` folders, read-only files,
  immutable-looking trees): a tmpfs is mounted afresh; a plain folder has its permissions restored before it
  is emptied. Call it only when no command of the jail runs.
- `hand_over()` gives `owner` every file and folder in it (what this process wrote there before the jail's
  commands run: a Task's `prepare`), links included but never followed.
- `close()` unmounts it. A tmpfs left mounted by a process that died is mounted afresh when the folder is used
  again.
- It never follows a link out of `path`, and refuses a `folder` that is a link or another user's
  (rollout.sandbox.private_root).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
from pathlib import Path

from rollout.sandbox.private_root import own_folder
from rollout.sandbox.staging import mounts_at, staged, unstage

MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(path: Path, size: int, owner: int) -> None:
    options = f"size={size},mode=0700,uid={owner},gid={owner}".encode()
    flags = 0x2 | 0x4  # MS_NOSUID | MS_NODEV
    if _libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", flags, options) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mounting a tmpfs on {path}: {os.strerror(error)}")


def _unmount(path: Path) -> None:
    if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unmounting {path}: {os.strerror(error)}")


def _writable_again(path: Path) -> None:
    """Give the owner back every permission under `path` (so a tree the jail locked can be removed)."""
    for folder, subfolders, _ in os.walk(path):
        for name in subfolders:
            child = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                if not os.path.islink(child):
                    os.chmod(child, stat.S_IRWXU)
    with contextlib.suppress(OSError):
        os.chmod(path, stat.S_IRWXU)


class Workspace:
    def __init__(self, folder: Path, *, disk_bytes: int, owner: int) -> None:
        self.disk_bytes = disk_bytes
        self.owner = owner
        self.quota = False
        for parent in reversed(folder.parents):
            if not parent.exists():
                parent.mkdir(mode=0o711)
        own_folder(folder, jail_uid=owner)  # never a link, nor a folder another user planted
        self.path = staged(folder, owner, writable=True)
        self._staged = self.path != folder.resolve()
        if os.geteuid() == 0:
            while mounts_at(self.path)[-1:] == ["tmpfs"]:
                _unmount(self.path)  # a tmpfs left by a sandbox that died
            try:
                _mount_tmpfs(self.path, disk_bytes, owner)
                self.quota = True
            except OSError:
                os.chown(self.path, owner, owner)

    def hand_over(self) -> None:
        if os.geteuid() != 0:
            return  # the jail runs as this process's own user: what it wrote is the jail's already
        for folder, subfolders, files in os.walk(self.path):
            for name in (*subfolders, *files):
                os.chown(os.path.join(folder, name), self.owner, self.owner, follow_symlinks=False)
        os.chown(self.path, self.owner, self.owner)

    def clear(self) -> None:
        if self.quota:
            _unmount(self.path)
            _mount_tmpfs(self.path, self.disk_bytes, self.owner)
            return
        for _ in range(2):  # a pass that found a locked folder unlocks it, the next one removes it
            _writable_again(self.path)
            for entry in os.scandir(self.path):
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
            if not any(os.scandir(self.path)):
                return
        raise OSError(f"the sandbox's working directory {self.path} could not be emptied")

    def close(self) -> None:
        if self.quota:
            with contextlib.suppress(OSError):
                _unmount(self.path)
            self.quota = False
        if self._staged:
            unstage(self.path)
