"""Sandboxes: worlds that agents share, leased by claim. See `rollout.sandbox.claims` for the pool's contract.

The names below are imported when first used: a process that needs only the jail (a grader's, say) does not
pay for the ledger's and HTTP's libraries.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.sandbox.claims import NoSandboxFree, SandboxClaim, SandboxPool, SandboxRegistration
    from rollout.sandbox.client import SandboxActionError, SandboxClient, SandboxSeat, SandboxSuperseded
    from rollout.sandbox.world import SandboxWorld, load_kind

_MODULES = {
    "NoSandboxFree": "rollout.sandbox.claims",
    "SandboxClaim": "rollout.sandbox.claims",
    "SandboxPool": "rollout.sandbox.claims",
    "SandboxRegistration": "rollout.sandbox.claims",
    "SandboxActionError": "rollout.sandbox.client",
    "SandboxClient": "rollout.sandbox.client",
    "SandboxSeat": "rollout.sandbox.client",
    "SandboxSuperseded": "rollout.sandbox.client",
    "SandboxWorld": "rollout.sandbox.world",
    "load_kind": "rollout.sandbox.world",
}

__all__ = [
    "NoSandboxFree",
    "SandboxActionError",
    "SandboxClaim",
    "SandboxClient",
    "SandboxPool",
    "SandboxRegistration",
    "SandboxSeat",
    "SandboxSuperseded",
    "SandboxWorld",
    "load_kind",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'rollout.sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name]), name)
