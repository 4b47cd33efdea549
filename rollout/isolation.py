"""How the commands agents choose are confined: one value, named in settings (`sandbox.isolation`), carried to
every runner and sandbox server, and handed to a Task in its `RunContext` (a grader jails what it grades alike).
`said(isolation)` is how `rollout status` puts it in words.
"""

from __future__ import annotations

from enum import StrEnum


class SandboxIsolation(StrEnum):
    bwrap = "bwrap"  # every command an agent chooses runs in a bubblewrap jail (Linux; docs/sandboxes.md)
    none = "none"  # unjailed: agents' commands run as the sandbox's own user, only when a person chose it


def said(isolation: SandboxIsolation) -> str:
    """The isolation in words, for people: an unjailed stack says so loudly."""
    if isolation is SandboxIsolation.bwrap:
        return "agents' commands jailed (bubblewrap)"
    return "agents' commands UNJAILED (sandbox.isolation=none)"
