"""What every command shares: the consoles, the one-paragraph error, settings from overrides, and the few
connections a command opens (Temporal, the blob store).

Contract: a command that cannot go on calls `fail(message)`, which prints one paragraph saying what to do next
and exits non-zero (2 for a configuration error, 1 for anything else); no command lets a traceback reach the
user for an error they can fix.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

# Imported where they are used, not here: every command imports this module, and `rollout --help` should not
# pay for Hydra, psycopg and the stack (rollout.config, rollout.ledger, rollout.stack).
if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout import config
    from rollout.blobs import BlobStore

out = Console()
err = Console(stderr=True, soft_wrap=True)

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Config overrides, KEY=VALUE (e.g. services.postgres.port=5433 data_dir=/tmp/r).",
        show_default=False,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def load_settings(overrides: list[str] | None) -> config.Settings:
    from rollout import config

    try:
        return config.load(overrides or [])
    except config.ConfigError as error:
        fail(f"{error}\nSee every setting with `rollout config show`.", code=2)


async def connect_temporal(settings: config.Settings, *, patience_s: float = 0.0) -> Client:
    """A Temporal client, or a clear error saying how to start Temporal. With `patience_s`, a server that is not
    answering (being restarted by the embedded stack's supervisor) is tried again for that long."""
    import asyncio
    import time

    from temporalio.client import Client

    deadline = time.monotonic() + patience_s
    while True:
        try:
            return await Client.connect(settings.temporal_address)
        except RuntimeError as error:
            if time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                continue
            fail(
                f"Temporal at {settings.temporal_address} is not answering ({error}): start it with `rollout up`"
            )


def as_service(settings: config.Settings, *secrets: str | bytes) -> None:
    """Set this process up as a long-running service whose output is its log: logging at `log_level`, and no
    secret (seat tokens, keys, passwords, `secrets`, API keys in the environment) written in clear."""
    import logging
    from urllib.parse import urlsplit

    from rollout import config
    from rollout.redaction import register_secret, scrub_process_output

    for url in (settings.ledger_url, settings.worker_ledger_url):
        register_secret(urlsplit(url).password)
    for secret in secrets:
        register_secret(secret)
    scrub_process_output()
    logging.basicConfig(
        level=settings.log_level.value, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    if settings.log_level != config.LogLevel.DEBUG:
        # One line per HTTP request (a runner makes one per turn) drowns what matters.
        for chatty in ("httpx", "httpcore", "httpx2", "httpcore2"):
            logging.getLogger(chatty).setLevel(logging.WARNING)


def blob_store(settings: config.Settings) -> BlobStore:
    from rollout.blobs import open_store

    blobs = settings.services.blobs
    return open_store(settings.blob_url, s3_endpoint=blobs.s3_endpoint, s3_secure=blobs.s3_secure)


def ledger_call[T](call: Coroutine[Any, Any, T]) -> T:
    """Run a command's ledger work; a ledger that cannot be reached is one clear message."""
    import asyncio

    from rollout.ledger.errors import LedgerError

    try:
        return asyncio.run(call)
    except LedgerError as error:
        fail(f"{error}\nIs the stack up? `rollout up` starts it; `rollout status` shows it.")


def guarded[T](action: Callable[[], T]) -> T:
    """Run a stack action, turning the errors users can fix into one clear message."""
    from rollout.ledger.errors import LedgerError
    from rollout.stack.engine import EngineNotRunnableError
    from rollout.stack.postgres import CorruptDataDirError
    from rollout.stack.processes import PortTakenError

    try:
        return action()
    except (PortTakenError, CorruptDataDirError, EngineNotRunnableError, LedgerError) as error:
        fail(str(error))
    except RuntimeError as error:
        fail(f"{error}\nLogs are under the data directory's logs/ folder; `rollout status` shows what runs.")


def local_model(spec: str, settings: config.Settings) -> str:
    """Where the model `spec` is (made once for the built-in ones); a catalog model not pulled yet is one clear
    error saying how to pull it."""
    from pathlib import Path

    from rollout.catalog import ModelNotPulled
    from rollout.engines.models import resolve

    try:
        return resolve(spec, Path(settings.models_dir).expanduser())
    except ModelNotPulled as error:
        fail(str(error))


def refuse_without_jail(settings: config.Settings, why: str) -> None:
    """Stop, in one paragraph, when commands agents choose would run jailed but no jail can be made here."""
    from rollout import config
    from rollout.sandbox.jail import jail_problem

    if (
        settings.sandbox.isolation is config.SandboxIsolation.bwrap
        and (problem := jail_problem()) is not None
    ):
        fail(f"{why}, and every such command runs in a jail; but {problem[0].lower()}{problem[1:]}")
