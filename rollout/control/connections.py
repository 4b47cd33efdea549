"""The connections an application call opens, each failing as a `ControlError` that says how to fix it.

Contract: `connect_temporal` returns a client or raises `Unreachable` naming the address and `rollout up`
(with `patience_s`, a server being restarted by the stack's supervisor is waited for that long); its clients
log Temporal's core warnings through Python logging, never straight to stderr;
`ledger_session` is `Ledger.connect` whose unreachable or broken ledger is `Unreachable`; `outlasting` repeats
a call while Temporal or the ledger is away; `local_model` resolves a model spec or raises `NotFound` saying
how to pull it; `stack_action` runs an embedded-stack action, its fixable failures as `ControlError`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from rollout.control.errors import STACK_HINT, ControlError, NotFound, Unreachable

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.runtime import Runtime

    from rollout.blobs import BlobStore
    from rollout.config import Settings
    from rollout.ledger import Ledger


_runtime: Runtime | None = None


def temporal_runtime() -> Runtime:
    """The Temporal runtime of this process's clients. Temporal's core writes its warnings (a call retried
    while the server restarts) straight to stderr, in the middle of a command's progress line; forwarded to
    the `temporalio.core` logger they reach a service's log and stay out of a command's output."""
    import logging

    from temporalio.runtime import (
        LogForwardingConfig,
        LoggingConfig,
        Runtime,
        TelemetryConfig,
        TelemetryFilter,
    )

    global _runtime
    if _runtime is None:
        core = logging.getLogger("temporalio.core")
        core.addHandler(logging.NullHandler())  # not Python's last-resort handler, which prints to stderr
        forwarded = LoggingConfig(
            filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
            forwarding=LogForwardingConfig(logger=core),
        )
        _runtime = Runtime(telemetry=TelemetryConfig(logging=forwarded))
    return _runtime


async def connect_temporal(settings: Settings, *, patience_s: float = 0.0) -> Client:
    from temporalio.client import Client

    from rollout.security.temporal_tls import TemporalTLSError, temporal_tls

    try:
        tls = temporal_tls(settings.services.temporal)
    except TemporalTLSError as error:
        raise ControlError(str(error)) from None
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return await Client.connect(
                settings.temporal_address,
                namespace=settings.services.temporal.namespace,
                tls=tls,
                runtime=temporal_runtime(),
            )
        except RuntimeError as error:
            if time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                continue
            raise Unreachable(
                f"Temporal at {settings.temporal_address} is not answering ({error}): start it with `rollout up`"
            ) from None


@asynccontextmanager
async def ledger_session(
    settings: Settings, *, reconnect_window_s: float | None = None, url: str | None = None
) -> AsyncIterator[Ledger]:
    """The ledger at `settings.ledger_url`, or at `url` (one of its narrower logins); a ledger error inside
    the block is `Unreachable`, with the hint."""
    from rollout.ledger import Ledger
    from rollout.ledger.errors import LedgerError

    url = url or settings.ledger_url
    try:
        if reconnect_window_s is None:
            ledger = await Ledger.connect(url)
        else:
            ledger = await Ledger.connect(url, reconnect_window_s=reconnect_window_s)
        async with ledger:
            yield ledger
    except LedgerError as error:
        raise Unreachable(f"{error}\n{STACK_HINT}") from None


async def outlasting[T](call: Callable[[], Awaitable[T]], window_s: float = 600.0) -> T:
    """`call()`, repeated while the ledger is away or Temporal's errors are transient
    (`rollout.control.waits.transient`), for at most `window_s`."""
    from rollout.control.waits import transient
    from rollout.ledger.errors import LedgerUnreachableError

    deadline = time.monotonic() + window_s
    while True:
        try:
            return await call()
        except Exception as error:
            if not (isinstance(error, LedgerUnreachableError) or transient(error)):
                raise
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


def blob_store(settings: Settings) -> BlobStore:
    from rollout.blobs import open_store

    blobs = settings.services.blobs
    return open_store(settings.blob_url, s3_endpoint=blobs.s3_endpoint, s3_secure=blobs.s3_secure)


def local_model(spec: str, settings: Settings) -> str:
    """Where the model `spec` is (made once for the built-in ones)."""
    from pathlib import Path

    from rollout.config.catalog import ModelNotPulled
    from rollout.engines.models import resolve

    try:
        return resolve(spec, Path(settings.models_dir).expanduser())
    except ModelNotPulled as error:
        raise NotFound(str(error)) from None


def stack_action[T](action: Callable[[], T]) -> T:
    """Run an embedded-stack action; the errors users can fix become `ControlError`."""
    from rollout.ledger.errors import LedgerError
    from rollout.stack.engine import EngineNotRunnableError
    from rollout.stack.postgres import CorruptDataDirError
    from rollout.stack.processes import PortTakenError

    try:
        return action()
    except (PortTakenError, CorruptDataDirError, EngineNotRunnableError, LedgerError) as error:
        raise ControlError(str(error)) from None
    except RuntimeError as error:
        raise ControlError(
            f"{error}\nLogs are under the data directory's logs/ folder; `rollout status` shows what runs."
        ) from None


def refuse_without_jail(settings: Settings, why: str) -> None:
    """Raise when commands agents choose would run jailed but no jail can be made here."""
    from rollout import config
    from rollout.sandbox.jail import jail_problem

    if (
        settings.sandbox.isolation is config.SandboxIsolation.bwrap
        and (problem := jail_problem()) is not None
    ):
        raise ControlError(
            f"{why}, and every such command runs in a jail; but {problem[0].lower()}{problem[1:]}"
        )
