"""Secrets out of text: what a service writes to its log, an error recorded in the ledger, a status line.

Contract:
- `scrub(text)` replaces with `***`: every seat token (`rs-` + 40 hex), sandbox claim secret (`rsc-` + 40
  hex), operator key (`ro-` + 48 hex) and engine API key (`re-` + 64 hex), however they appear (a base URL's
  `/s/TOKEN`, a header, a message); the password of every URL (`scheme://user:PASSWORD@host`); and the value
  of every secret registered with `register_secret` or found in the environment under a secret's name
  (`*_API_KEY`, `*_SECRET`, `*_SECRET_KEY`, `*_SECRET_ACCESS_KEY`, `*_TOKEN`, `*PASSWORD`, `PGPASSWORD`,
  `*_PRIVATE_KEY`, `*_CREDENTIALS`, `SSH_AUTH_SOCK`, `DATABASE_URL`, ...; values of at least
  `MIN_SECRET_LENGTH` characters, so a short word is never blanked out everywhere).
- `without_secrets(environ)` is an environment less the variables named like secrets: what a command we do not
  trust (an agent, a model's shell command) inherits.
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
from collections.abc import Mapping
from typing import Any, TextIO, cast
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
MIN_SECRET_LENGTH = 8

# Whole tokens only: not the tail of a longer word, not the head of a longer hex string.
SEAT_TOKEN = re.compile(r"(?<![A-Za-z0-9])rs-[0-9a-f]{40}(?![0-9a-f])")
CLAIM_SECRET = re.compile(r"(?<![A-Za-z0-9])rsc-[0-9a-f]{40}(?![0-9a-f])")
OPERATOR_KEY = re.compile(r"(?<![A-Za-z0-9])ro-[0-9a-f]{48}(?![0-9a-f])")
ENGINE_API_KEY = re.compile(r"(?<![A-Za-z0-9])re-[0-9a-f]{64}(?![0-9a-f])")
# scheme://user:password@host — the password runs from the colon to the '@' (in a URL a password holds '@',
# '/' or ':' only percent-encoded).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)(?P<password>[^\s/@]+)(?=@)")
# Environment variables whose values are secrets wherever they appear.
_SECRET_NAME = re.compile(
    r"(_API_KEY|_APIKEY|_SECRET|_SECRET_KEY|_SECRET_ACCESS_KEY|_TOKEN|_SESSION_TOKEN|PASSWORD|_PASSWD|_PASS)$"
    r"|_PRIVATE_KEY$|_CREDENTIALS$"
    r"|^(PGPASSWORD|ROLLOUT_OPERATOR_KEY|SSH_AUTH_SOCK|DATABASE_URL|GOOGLE_APPLICATION_CREDENTIALS)$",
    re.IGNORECASE,
)

_registered: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | bytes | None) -> None:
    """Have `scrub` blank `value` out from now on (bytes, such as a random key, by their hex spelling)."""
    if value is None:
        return
    text = value.hex() if isinstance(value, bytes) else value
    if len(text) >= MIN_SECRET_LENGTH:
        with _lock:
            _registered.add(text)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret (`TINKER_API_KEY`, `PGPASSWORD`, ...)."""
    return _SECRET_NAME.search(name) is not None


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less every variable named like a secret: what a command we do not trust may inherit."""
    return {name: value for name, value in environ.items() if not is_secret_name(name)}


def environment_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """The values of the environment's variables that are named like secrets."""
    found = environ if environ is not None else dict(os.environ)
    return [
        value for name, value in found.items() if is_secret_name(name) and len(value) >= MIN_SECRET_LENGTH
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
    text = ENGINE_API_KEY.sub(MASK, text)
    text = CLAIM_SECRET.sub(MASK, text)
    return _URL_PASSWORD.sub(lambda match: match.group("head") + MASK, text)


def redact_url(url: str) -> str:
    """The URL without its password, fit for an error message or a status line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:{MASK}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class ScrubbingStream:
    """A text stream that scrubs what is written before passing it on; anything else is the wrapped
    stream's."""

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
