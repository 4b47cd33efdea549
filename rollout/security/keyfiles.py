"""Secrets kept in files: made once, never readable by others (the gateway's token secret, the operator key,
the sandbox key, the embedded ledger's passwords).

Contract: `secret_file(path, make)` is the content of `path`, made by `make` the first time, created with mode
600 and exclusively, so two processes making it at once read the same secret. `ledger_password(data_dir,
user)` is the embedded Postgres's password of `user`, made once (`ledger_password_path`);
`known_ledger_password` reads it without making it (None before the server made it).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path


def secret_file(path: Path, make: Callable[[], bytes]) -> bytes:
    """The secret kept at `path`, made by `make` the first time. The file is created with mode 600 (never
    readable by others, not even for a moment) and exclusively: of two processes making it at once, one writes
    and both read what it wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(make())
            handle.flush()
            os.fsync(handle.fileno())
    for _ in range(100):
        if content := path.read_bytes():
            return content
        time.sleep(0.01)  # its maker has created it and is writing it
    raise RuntimeError(f"{path} is empty: remove it, and it is made again")


def ledger_password_path(data_dir: Path, user: str) -> Path:
    return data_dir / f"ledger-{user}.password"


def ledger_password(data_dir: Path, user: str) -> str:
    """The embedded Postgres's password of `user` (URL-safe), made the first time it is asked for."""
    made = secret_file(ledger_password_path(data_dir, user), lambda: secrets.token_urlsafe(32).encode())
    return made.decode()


def known_ledger_password(data_dir: Path, user: str) -> str | None:
    """The password of `user` if the embedded Postgres made one (reading only: a configuration that names
    no server yet makes nothing)."""
    try:
        return ledger_password_path(data_dir, user).read_text() or None
    except (FileNotFoundError, PermissionError):
        return None
