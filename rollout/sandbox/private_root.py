"""This user's own folder for sandbox state outside the data directory, which no other local user can plant.

Contract:
- `private_root()` is `TMPDIR/rollout-UID`, made (0711: a jail's uid walks through it, nobody else lists or
  writes it) when missing. When it is there already it must be a real folder (never a link), this user's,
  and writable by no one else: otherwise another local user made it (to point this user's sandboxes, and
  their resets, at a folder of their choosing) and `ForeignFolder` refuses it, saying what to do. Everything
  below it is made by this user, so no one else can plant a link there.
- `own_folder(path, jail_uid=)` makes `path` (0700) or checks the one there the same way (owned by this
  user, or by the jail's uid it was handed to): a workspace is never a link, nor another user's folder.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


class ForeignFolder(PermissionError):
    """A folder rollout would keep sandbox state in is a link, another user's, or writable by others."""


def _check_own(path: Path, owners: frozenset[int] = frozenset()) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        what = "a link" if stat.S_ISLNK(info.st_mode) else "not a folder"
    elif info.st_uid not in {os.geteuid(), *owners}:
        what = f"owned by uid {info.st_uid}, not this user ({os.geteuid()})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        what = "writable by other users"
    else:
        return
    raise ForeignFolder(
        f"{path} is {what}: another local user may have made it to redirect this user's sandboxes, so it is "
        "not used; remove it (or set TMPDIR to a folder of your own) and start again"
    )


def private_root() -> Path:
    root = Path(tempfile.gettempdir()) / f"rollout-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o711)
    _check_own(root)
    return root


def own_folder(path: Path, *, mode: int = 0o700, jail_uid: int | None = None) -> Path:
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
    _check_own(path, frozenset() if jail_uid is None else frozenset({jail_uid}))
    return path
