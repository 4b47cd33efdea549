"""The record of a sandbox server joining its kind's pool (`SandboxRegistered`, on `sandboxes/{kind}`).

Contract: a registration names a sandbox by a plain name (`SANDBOX_NAME`), the HTTP(S) address it serves on
(a host, no credentials, a numeric port if any) and its seats (1 or more); anything else is refused where it
is read, so a forged registration never becomes an address a runner connects to. Pure data:
rollout.sandbox.claims registers and reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from rollout.records import Payload

SANDBOX_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class SandboxRegistered(Payload):
    kind: str
    name: str
    address: str
    seats: int

    def __post_init__(self) -> None:
        if not SANDBOX_NAME.match(self.name):
            raise ValueError(f"{self.name!r} is not a sandbox's name")
        if self.seats < 1:
            raise ValueError(f"a sandbox has at least one seat, not {self.seats}")
        parts = urlsplit(self.address)
        parts.port  # noqa: B018 - raises on a port that is not a number
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
            raise ValueError(f"{self.address!r} is not an address a sandbox serves on")
