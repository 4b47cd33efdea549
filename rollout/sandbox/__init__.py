"""Sandboxes: worlds that agents share, leased by claim. See `rollout.sandbox.claims` for the pool's contract."""

from rollout.sandbox.claims import NoSandboxFree, SandboxClaim, SandboxPool, SandboxRegistration
from rollout.sandbox.client import SandboxClient, SandboxSeat, SandboxSuperseded
from rollout.sandbox.world import SandboxWorld, load_kind

__all__ = [
    "NoSandboxFree",
    "SandboxClaim",
    "SandboxClient",
    "SandboxPool",
    "SandboxRegistration",
    "SandboxSeat",
    "SandboxSuperseded",
    "SandboxWorld",
    "load_kind",
]
