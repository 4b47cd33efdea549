"""Secrets kept in files: made once, never readable by others (the gateway's token secret, the operator key,
the sandbox key).

Contract: `secret_file(path, make)` is the content of `path`, made by `make` the first time, created with mode
600 and exclusively, so two processes making it at once read the same secret.
"""

from __future__ import annotations

import os
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
