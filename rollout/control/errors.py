"""The one error the control layer raises: what went wrong and what to do next, in one paragraph.

Contract: every failure a user can fix (a bad setting, a run or suite that does not exist, a service not
answering, a runner that cannot load the environment) is a `ControlError` whose message is that paragraph;
`usage` is True when the request itself was wrong (the CLI exits 2 for those, 1 for the rest). Nothing in
rollout.control prints; its callers decide how to show the message.
"""

from __future__ import annotations


class ControlError(Exception):
    """A failure the user can fix; `str(error)` says how."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage

    def __str__(self) -> str:
        return self.message


class NotFound(ControlError):
    """A run, suite, checkpoint or schedule the request names does not exist."""


class Unreachable(ControlError):
    """A service the request needs (the ledger, Temporal, an engine) does not answer."""


STACK_HINT = "Is the stack up? `rollout up` starts it; `rollout status` shows it."
