"""What the command-line tests on one stack (tests/test_cli_on_one_stack.py) drive it with: the `rollout`
command as a user runs it, the stack they share, and reads of the ledger and of the CLI's JSON."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.config import Settings
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import count_events
from rollout.ledger.streams import run_episodes_stream

ROLLOUT = str(Path(sys.executable).parent / "rollout")


def rollout(
    *args: str, cwd: Path, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ROLLOUT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return done


@dataclass(frozen=True)
class UserStack:
    """The stack this module's tests share: `rollout up` with the gateway, the tiny model and cpu-micro."""

    data: Path
    overrides: list[str]  # every command's settings: the data directory and the ports
    settings: Settings
    started: dict[str, dict[str, Any]]  # `rollout up --json`'s services, by name
    elsewhere: Path  # where `up` ran: not where any environment lives


def runs(overrides: list[str], cwd: Path) -> dict[str, dict[str, Any]]:
    return {
        row["run"]: row for row in json.loads(rollout("run", "list", "--json", *overrides, cwd=cwd).stdout)
    }


def episodes_in_ledger(settings: Settings, run: str) -> int:
    async def count() -> int:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            return await count_events(ledger, run_episodes_stream(run), Kind.EPISODE_FINISHED)

    return asyncio.run(count())


def services(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    return {service["name"]: service for service in json.loads(done.stdout)["services"]}


def ledger_read[T](settings: Settings, read: Callable[[Ledger], Awaitable[T]]) -> T:
    async def go() -> T:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            return await read(ledger)

    return asyncio.run(go())


def schedule_row(overrides: list[str], cwd: Path) -> dict[str, Any] | None:
    rows = json.loads(rollout("eval", "schedules", "list", "--json", *overrides, cwd=cwd).stdout)
    return rows[0] if rows else None


def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(1)


async def eval_runs(ledger: Ledger) -> list[str]:
    from rollout.ledger.queries import list_runs

    return [run.run for run in await list_runs(ledger)]


def finished_episodes(settings: Settings, run: str) -> int:
    return ledger_read(
        settings, lambda ledger: count_events(ledger, run_episodes_stream(run), Kind.EPISODE_FINISHED)
    )
