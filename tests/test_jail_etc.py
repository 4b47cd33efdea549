"""The jail's `/etc` (rollout.sandbox.jail_etc): a copy of the allowed entries that keeps their modes, is made
again when a cleaner removed it, and is refused when someone else could have written it."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from rollout.sandbox import jail_etc as module
from rollout.sandbox.private_root import ForeignFolder


def test_the_copy_keeps_modes_comes_back_and_is_refused_when_writable_by_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etc, root = tmp_path / "etc", tmp_path / "private"
    (etc / "ssl" / "certs").mkdir(parents=True)
    root.mkdir(mode=0o711)
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "secret-of-root").write_text("root only\n")
    (etc / "secret-of-root").chmod(0o600)
    (etc / "ssl" / "certs" / "ca.pem").symlink_to("/usr/share/ca-certificates/ca.pem")
    monkeypatch.setattr(module, "ETC", etc)
    monkeypatch.setattr(module, "private_root", lambda: root)
    names = ("hosts", "secret-of-root", "ssl/certs", f"missing-{uuid.uuid4().hex[:6]}")

    copied = module.jail_etc(names)
    assert (copied / "hosts").read_text() == "127.0.0.1 localhost\n"
    assert (copied / "secret-of-root").stat().st_mode & 0o777 == 0o600, "a root-only file stays root-only"
    assert os.readlink(copied / "ssl" / "certs" / "ca.pem") == "/usr/share/ca-certificates/ca.pem"
    assert not (copied / names[-1]).exists()

    shutil.rmtree(copied)  # a cleaner of the temporary folder
    assert module.jail_etc(names) == copied and (copied / "hosts").is_file(), "made again, same name"

    copied.chmod(0o777)  # as if another user could have written it
    with pytest.raises(ForeignFolder):
        module.jail_etc(names)
