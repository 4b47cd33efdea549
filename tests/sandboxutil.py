"""Sandboxes in tests: one sandbox key for every test's runners and hosted sandboxes, and seats that carry the
secret of their claim (rollout.sandbox.keys)."""

from __future__ import annotations

from rollout.harness import SandboxSeat
from rollout.sandbox.keys import claim_secret

SANDBOX_KEY = b"rollout-tests-sandbox-key-32byte"


def claimed_seat(
    address: str, kind: str, name: str, *, epoch: int, seat: int, holder: str = ""
) -> SandboxSeat:
    """Seat `seat` of sandbox `name` under the claim (`epoch`, `holder`), proven with the tests' key."""
    secret = claim_secret(SANDBOX_KEY, kind, name, epoch, holder)
    return SandboxSeat(address, kind, name, epoch=epoch, seat=seat, holder=holder, secret=secret)
