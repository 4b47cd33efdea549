"""The ledger's password goes to services in a file, never on their command lines.

Contract: `password_out_of(url)` is `url` without its password, and the password (percent-decoding undone), or
None when it holds none. `passfile_for(data_dir, *urls)` writes their passwords as a libpq password file (mode
600, `run/ledger.pgpass` in the data directory), each for its URL's user on any host, port and database, and
returns its path (None when no URL holds a password). A service started with `PGPASSFILE` set to it and the
URL without the password connects as before (libpq, so psycopg, reads the file), and `ps` shows no password.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

PASSFILE = "ledger.pgpass"


def password_out_of(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}")), unquote(parts.password)


def _escaped(field: str) -> str:
    return field.replace("\\", "\\\\").replace(":", "\\:")


def passfile_for(data_dir: Path, *urls: str) -> Path | None:
    lines = []
    for url in urls:
        _, password = password_out_of(url)
        if password is not None:
            user = unquote(urlsplit(url).username or "")
            lines.append(f"*:*:*:{_escaped(user)}:{_escaped(password)}\n")
    if not lines:
        return None
    path = data_dir / "run" / PASSFILE
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole each time (the configured password may have changed), created mode 600 and renamed into
    # place: never readable by others, not even for a moment (libpq also ignores a file others may read).
    partial = path.with_name(f".{PASSFILE}.{os.getpid()}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.writelines(dict.fromkeys(lines))
    partial.replace(path)
    return path
