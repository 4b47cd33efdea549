"""What every command shares: the consoles, the one-paragraph error, and settings from overrides.

Contract: long work says how it goes through `progress` (a spinner on a terminal, plain lines elsewhere). A
command that cannot go on calls `fail(message)` or lets the control layer's `ControlError` reach
`rollout.cli.app.main`; either prints one paragraph saying what to do next and exits non-zero (2 for a
configuration error or a wrong request, 1 for anything else); no command lets a traceback reach the user for
an error they can fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console

# Imported where they are used, not here: every command imports this module, and `rollout --help` should not
# pay for Hydra, psycopg and the stack (rollout.config, rollout.ledger, rollout.stack).
if TYPE_CHECKING:
    from rollout import config

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


@contextmanager
def progress(first: str) -> Iterator[Callable[[str], None]]:
    """A line saying how long work goes, for the block's `report(line)`: a spinner on a terminal; elsewhere
    (CI logs, a pipe) a plain line each time what it says changes, its running seconds aside."""
    if err.is_terminal:
        with err.status(first) as spinner:
            yield spinner.update
        return
    said = [re.sub(r"\(\d+ s\)", "", first)]
    err.print(first, highlight=False, markup=False)

    def plain(line: str) -> None:
        gist = re.sub(r"\(\d+ s\)", "", line)
        if line and gist != said[0]:
            said[0] = gist
            err.print(line, highlight=False, markup=False)

    yield plain


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def load_settings(overrides: list[str] | None) -> config.Settings:
    from rollout import config

    try:
        return config.load(overrides or [])
    except config.ConfigError as error:
        fail(f"{error} (`rollout config show` shows every setting)", code=2)


def as_service(settings: config.Settings, *secrets: str | bytes) -> None:
    """Set this process up as a long-running service whose output is its log: logging at `log_level`, and no
    secret (seat tokens, keys, passwords, `secrets`, API keys in the environment) written in clear."""
    import logging
    from urllib.parse import urlsplit

    from rollout import config
    from rollout.security.redaction import register_secret, scrub_process_output

    for url in (settings.ledger_url, *settings.service_ledger_urls):
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
