"""Secrets out of text: what a service writes to its log, an error recorded in the ledger, a status line.

Contract:
- `scrub(text)` replaces with `***`: every seat token (`rs-` + 40 hex) and operator key (`ro-` + 48 hex),
  however they appear (a base URL's `/s/TOKEN`, a header, a message); the password of every URL
  (`scheme://user:PASSWORD@host`); and the value of every secret registered with `register_secret` or found in
  the environment under a secret's name (`*_API_KEY`, `*_SECRET*`, `*_TOKEN`, `*PASSWORD*`, ...; values of at
  least `MIN_SECRET_LENGTH` characters, so a short word is never blanked out everywhere).
- `redact_url(url)` is the URL without its password (the user, host, port and path stay readable).
- `scrub_process_output()` makes everything this process writes through `sys.stdout` / `sys.stderr` pass
  through `scrub`: logging handlers, uncaught tracebacks, prints and rich consoles alike (a service's
  output is its log file). Text is scrubbed one `write` at a time: a secret split across two writes is not
  recognised, which no logger or traceback printer does.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from typing import Any, TextIO, cast
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
MIN_SECRET_LENGTH = 8

# Whole tokens only: not the tail of a longer word, not the head of a longer hex string.
SEAT_TOKEN = re.compile(r"(?<![A-Za-z0-9])rs-[0-9a-f]{40}(?![0-9a-f])")
OPERATOR_KEY = re.compile(r"(?<![A-Za-z0-9])ro-[0-9a-f]{48}(?![0-9a-f])")
# scheme://user:password@ — the password is whatever runs to the last '@' before the host (a password may
# hold '@' only percent-encoded, so the first '@' after the colon ends it).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)(?P<password>[^\s/@]+)(?=@)")
# Environment variables whose values are secrets wherever they appear.
_SECRET_NAME = re.compile(
    r"(_API_KEY|_APIKEY|_SECRET|_SECRET_KEY|_SECRET_ACCESS_KEY|_TOKEN|_SESSION_TOKEN|PASSWORD|_PASSWD|_PASS)$"
    r"|^(PGPASSWORD|ROLLOUT_OPERATOR_KEY)$",
    re.IGNORECASE,
)

_registered: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | bytes | None) -> None:
    """Have `scrub` blank `value` out from now on (bytes are registered as their hex spelling too)."""
    if value is None:
        return
    values = [value.hex(), value.decode("utf-8", "ignore")] if isinstance(value, bytes) else [value]
    with _lock:
        _registered.update(v for v in values if len(v) >= MIN_SECRET_LENGTH)


def environment_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """The values of the environment's variables that are named like secrets."""
    found = environ if environ is not None else dict(os.environ)
    return [
        value
        for name, value in found.items()
        if _SECRET_NAME.search(name) and len(value) >= MIN_SECRET_LENGTH
    ]


def _known_secrets() -> list[str]:
    with _lock:
        known = set(_registered)
    known.update(environment_secrets())
    # Longest first, so a secret that contains another is blanked out whole.
    return sorted(known, key=len, reverse=True)


def scrub(text: str) -> str:
    """`text` with every secret this process knows of, and every token-shaped string, replaced by `***`."""
    if not text:
        return text
    for secret in _known_secrets():
        if secret in text:
            text = text.replace(secret, MASK)
    text = SEAT_TOKEN.sub(MASK, text)
    text = OPERATOR_KEY.sub(MASK, text)
    return _URL_PASSWORD.sub(lambda match: match.group("head") + MASK, text)


def redact_url(url: str) -> str:
    """The URL without its password, fit for an error message or a status line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:{MASK}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class ScrubbingStream:
    """A text stream that scrubs what is written before passing it on; anything else is the wrapped stream's."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(scrub(text))
        return len(text)  # the caller's count: what it asked to write

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def scrub_process_output() -> None:
    """Scrub everything written to this process's `sys.stdout` and `sys.stderr` from now on (idempotent)."""
    if not isinstance(sys.stdout, ScrubbingStream):
        sys.stdout = cast(TextIO, ScrubbingStream(sys.stdout))
    if not isinstance(sys.stderr, ScrubbingStream):
        sys.stderr = cast(TextIO, ScrubbingStream(sys.stderr))


def unscrubbed(stream: TextIO) -> TextIO:
    """The stream under any scrubbing of `stream`: only for output whose purpose is to hand a secret out."""
    return stream._inner if isinstance(stream, ScrubbingStream) else stream
