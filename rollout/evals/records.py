"""Eval records in the ledger: registered suites, and one `EvalResult` per (suite@version, checkpoint,
environment).

Contract:
- `register(ledger, suite)` appends `EvalSuiteRegistered` on `evals/suites` under `name@version` with the
  suite's declaration and content hash. Registering the same content again changes nothing (returns False);
  other content under a version already registered raises `SuiteVersionTaken` (bump the version). Nothing is
  ever overwritten.
- `find_suite(ledger, name, version=None)` returns the registered suite (the newest registered version when
  none is given), or raises `UnknownSuite` naming the versions or suites there are.
- `EvalResult` is recorded on `evals/{suite}/results` under `{version}/{checkpoint}/{environment}`: recording
  a result again (a retried or repeated eval) changes nothing; the first one stands.
- `results(ledger, suite=None)` reads them back, oldest first; `every_result(ledger)` reads every suite's at
  once. A payload on those streams that is not a result, or on `evals/suites` not a registration, is passed
  over (any login that may append there could have written it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollout.evals.suites import Suite, suite_from_payload
from rollout.ledger.errors import KeyConflictError
from rollout.ledger.events import Kind, NewEvent
from rollout.ledger.queries import read_all
from rollout.ledger.records import record_of, records_of
from rollout.ledger.streams import EVAL_SUITES, eval_results_stream
from rollout.ledger.views import eval_results
from rollout.records.evals import EvalResult, SuiteRegistered, result_key

if TYPE_CHECKING:
    from rollout.ledger import Ledger


class SuiteVersionTaken(ValueError):
    """Different content was registered under a version that already holds a suite."""


class UnknownSuite(LookupError):
    """No suite (or no such version of it) is registered."""


async def register(ledger: Ledger, suite: Suite) -> bool:
    """Record `suite` under `name@version`; True when this call recorded it."""
    registered = SuiteRegistered(suite.payload(), suite.content_hash())
    try:
        recorded = await ledger.append_one(
            EVAL_SUITES, NewEvent(suite.ref, Kind.EVAL_SUITE_REGISTERED, registered.to_payload())
        )
    except KeyConflictError:
        raise SuiteVersionTaken(
            f"suite {suite.ref} is already registered with other content: bump its version to register the change"
        ) from None
    return recorded.appended


async def registered_suites(ledger: Ledger) -> list[tuple[Suite, str]]:
    """Every registered suite version with its content hash, in registration order."""
    registered: list[tuple[Suite, str]] = []
    for event in await read_all(ledger, EVAL_SUITES):
        try:
            record = record_of(event)
            if not isinstance(record, SuiteRegistered):
                continue
            suite = suite_from_payload(record.suite, event.key)
        except (TypeError, ValueError):  # SuiteError, or a field of a type no check foresaw
            continue  # not a registration of ours: no suite of that name is on record for it
        registered.append((suite, record.content_hash))
    return registered


async def find_suite(ledger: Ledger, name: str, version: str | None = None) -> Suite:
    versions = [suite for suite, _ in await registered_suites(ledger) if suite.name == name]
    if version is not None:
        for suite in versions:
            if suite.version == version:
                return suite
        if versions:
            raise UnknownSuite(
                f"suite {name} has no version {version!r}: registered versions are "
                f"{', '.join(s.version for s in versions)}"
            )
    if not versions:
        names = sorted({suite.name for suite, _ in await registered_suites(ledger)})
        raise UnknownSuite(
            f"no suite {name!r} is registered (registered: {', '.join(names) or 'none'}); register one with "
            "`rollout eval register FILE`"
        )
    return versions[-1]


async def record_result(ledger: Ledger, result: EvalResult) -> EvalResult:
    """Append `result` unless one is recorded under its key; return the one that stands."""
    stream = eval_results_stream(result.suite)
    try:
        recorded = await ledger.append_one(
            stream, NewEvent(result.key, Kind.EVAL_RESULT, result.to_payload())
        )
    except KeyConflictError:
        found = await ledger.find(stream, result.key)
        assert found is not None
        return EvalResult.from_payload(dict(found.payload))
    return EvalResult.from_payload(dict(recorded.payload))


async def find_result(
    ledger: Ledger, suite: str, version: str, checkpoint: str, environment: str
) -> EvalResult | None:
    found = await ledger.find(eval_results_stream(suite), result_key(version, checkpoint, environment))
    return None if found is None else EvalResult.from_payload(dict(found.payload))


async def results(ledger: Ledger, suite: str | None = None) -> list[EvalResult]:
    """Every recorded result of `suite` (of every registered suite when None), oldest first."""
    names = [suite] if suite is not None else sorted({s.name for s, _ in await registered_suites(ledger)})
    found: list[EvalResult] = []
    for name in names:
        found.extend(records_of(await read_all(ledger, eval_results_stream(name)), EvalResult))
    return found


async def every_result(ledger: Ledger) -> list[EvalResult]:
    """Every recorded result of every suite, registered or not, oldest first (one indexed read by kind)."""
    return await eval_results(ledger)
