"""Another local user cannot point this user's sandboxes at a folder of their choosing: the folder for
sandbox state in the temporary folder (`TMPDIR/rollout-UID`) is refused when someone else made it, or made it
a link or writable by others, and a workspace is never a link (rollout.sandbox.private_root).

The attack: before this user's first sandbox, the other user creates `/tmp/rollout-UID` (anyone may create in
/tmp) with a link inside where a workspace will be, to the victim's home. Unchecked, the first claim's reset
empties the home, and the jail mounts it writable.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.sandbox.hosting import sandbox_workdir
from rollout.sandbox.jail import jail_uid
from rollout.sandbox.private_root import ForeignFolder, private_root
from rollout.sandbox.workspace import Workspace

OTHER_UID = 54321  # another local user


@pytest.fixture
def temporary(tmp_path: Path) -> Iterator[Path]:
    """The temporary folder moved to a fresh one, like the machine's /tmp (sticky, world-writable)."""
    folder = tmp_path / "tmp"
    folder.mkdir(mode=0o1777)
    os.chmod(folder, 0o1777)
    before = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = before


def victim_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("four years of work")
    return home


def planted(temporary: Path) -> Path:
    return temporary / f"rollout-{os.geteuid()}"


def test_a_root_folder_another_user_made_is_refused_and_the_victims_files_stay(
    temporary: Path, tmp_path: Path
) -> None:
    home = victim_home(tmp_path)
    root = planted(temporary)
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    os.chown(root, OTHER_UID, OTHER_UID)  # as the other user made it
    with pytest.raises(ForeignFolder, match=f"owned by uid {OTHER_UID}"):
        private_root()
    os.chown(root, os.geteuid(), os.geteuid())  # this user's, but anyone may write in it
    with pytest.raises(ForeignFolder, match="writable by other users"):
        sandbox_workdir(tmp_path / "data", "shell", "box-0")
    root.rmdir()
    root.symlink_to(home)  # a link to the victim's home
    with pytest.raises(ForeignFolder, match="is a link"):
        private_root()
    assert (home / "thesis.tex").read_text() == "four years of work"


def test_a_workspace_that_is_a_link_is_never_emptied_nor_used(temporary: Path, tmp_path: Path) -> None:
    home = victim_home(tmp_path)
    workdir = sandbox_workdir(tmp_path / "data", "shell", "box-0")  # the private root, made right
    workdir.parent.mkdir(parents=True)
    workdir.symlink_to(home)  # what a planted link would be
    with pytest.raises(ForeignFolder, match="is a link"):
        Workspace(workdir, disk_bytes=1 << 20, owner=jail_uid())
    assert (home / "thesis.tex").read_text() == "four years of work"
    workdir.unlink()
    workspace = Workspace(workdir, disk_bytes=1 << 20, owner=jail_uid())  # made by this user: used
    try:
        (workspace.path / "scratch").write_text("x")
        workspace.clear()
        assert not any(workspace.path.iterdir())
    finally:
        workspace.close()
    assert oct(os.stat(private_root()).st_mode & 0o777) == oct(0o711)
