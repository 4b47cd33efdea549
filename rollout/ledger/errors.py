"""The ledger's errors, each saying what happened and what to do next.

`ledger_append` raises custom SQLSTATEs; `translate` turns them into these exceptions so callers never
match on Postgres error text. `StaleFenceError.type_name` is the Temporal `ApplicationError` type that
activities raise as non-retryable.
"""

from __future__ import annotations

import psycopg

from rollout.security.redaction import redact_url, scrub


class LedgerError(RuntimeError):
    """Base of every ledger error."""


class KeyConflictError(LedgerError):
    """An idempotency key was reused with a different payload: a bug in whoever chose the key."""


class StaleFenceError(LedgerError):
    """The writer's lease epoch is no longer current: a successor took over; this attempt must stop."""

    type_name = "StaleFence"


class AppendOnlyError(LedgerError):
    """Something tried to change or delete an event."""


class LedgerUnreachableError(LedgerError):
    """Postgres could not be reached at the configured URL."""

    def __init__(self, url: str, reason: str) -> None:
        self.reason = scrub(reason.strip())  # why, without the URL or what to do
        advice = (
            "The server asks for a password: the embedded one keeps its passwords in its data directory, so give "
            "the stack's `data_dir=`; a server of your own takes it in `services.postgres.url=`."
            if "password" in self.reason
            else "Start the embedded stack with `rollout up`, or point `services.postgres.url=` at a running "
            "Postgres."
        )
        super().__init__(f"cannot reach the ledger at {redact(url)}: {self.reason}\n{advice}")


_BY_SQLSTATE: dict[str, type[LedgerError]] = {
    "RL409": KeyConflictError,
    "RL410": StaleFenceError,
    "RL403": AppendOnlyError,
}


def translate(error: psycopg.Error) -> Exception:
    """The ledger exception for a database error raised by the ledger's own SQL, else the error itself."""
    kind = _BY_SQLSTATE.get(error.sqlstate or "")
    if kind is None:
        return error
    message = error.diag.message_primary or str(error)
    return kind(message)


def redact(url: str) -> str:
    """The URL without its password, fit for an error message or a status line."""
    return redact_url(url)
