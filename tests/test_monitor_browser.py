"""The dashboard in a real browser: Chromium (Debian's, driven by Playwright) opens each view of a running
`rollout monitor` and sees what a person would (the run, a transcript's tokens, the tree's nodes, a score, the
services), and the Pause button pauses a playing run (checked in the ledger); a ledger outage is a banner that
gives way to the page by itself once the ledger is back. Screenshots of every view are left in
`build/screenshots/monitor/`.

Chromium is a system package (`.ci/run` installs it with apt-get): without one, the test is skipped, except in
CI (`CI` set), where a missing browser fails it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Literal

import httpx
import pytest

from rollout import config
from rollout.config import Settings
from rollout.ledger import Ledger
from rollout.ledger.queries import find_run
from rollout.net import free_port
from rollout.run.settings import RunSettings
from rollout.workflows.names import run_policy, run_workflow_id
from rollout.workflows.run import RunWorkflow
from rollout.workflows.run_types import RunInput
from rollout_testing.stacks import monitor_overrides
from tests.test_training_loop import training_loop

ROLLOUT = str(Path(sys.executable).parent / "rollout")
SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots" / "monitor"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None and not os.environ.get("CI"),
        reason="no Chromium here (apt-get install chromium); CI installs it and runs this test",
    ),
]


@pytest.mark.timeout(900)
async def test_a_browser_sees_every_view_and_pauses_a_run(
    stack_settings: Settings,
    ledger: Ledger,
    tiny_qwen3: str,
    models_dir: Path,
    tmp_path: Path,
    trained_run: str,
) -> None:
    from playwright.async_api import async_playwright

    assert CHROMIUM is not None, "CI installs Chromium (.ci/run): none was found"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    overrides = monitor_overrides(stack_settings, models_dir)
    assert config.load(overrides).ledger_url == stack_settings.ledger_url
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "monitor.log").open("wb")
    monitor = await asyncio.create_subprocess_exec(
        ROLLOUT, "monitor", "--port", str(port), *overrides, stdout=log, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with training_loop(stack_settings, ledger, tiny_qwen3, tmp_path) as loop:
            # A run that keeps playing (no training) until it is stopped: its controls show.
            playing = await loop.client.start_workflow(
                RunWorkflow.run,
                RunInput(
                    loop.run,
                    "tests.example_envs:coin",
                    groups_in_flight=1,
                    settings=RunSettings(max_tokens=4),
                ),
                id=run_workflow_id(loop.run),
                task_queue=loop.queue,
            )
            await _until(lambda: _exists(ledger, loop.run), 60, "the run was not recorded")
            await _until(lambda: _healthy(url), 120, f"the dashboard did not start: {_tail(tmp_path)}")
            policy = run_policy(trained_run, "default")
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = await browser.new_page(viewport={"width": 1400, "height": 1100})
                # Visible text, or text in a table (the data grid paints on a canvas and keeps its cells in
                # the page for screen readers: there, in the page is what a person sees).
                views: list[tuple[str, str, Literal["attached", "visible"]]] = [
                    (f"?run={trained_run}", trained_run, "attached"),  # Runs is the main page
                    (f"?run={trained_run}", "Per step", "visible"),  # the chosen run, below the table
                    (f"transcripts?run={trained_run}", "sampled by", "visible"),
                    (f"checkpoints?run={trained_run}", "step 2", "visible"),
                    ("evals", f"{policy}-step000002", "attached"),
                    ("machines", "rollout-runner", "attached"),
                ]
                for path, seen, state in views:
                    await page.goto(f"{url}/{path}")
                    await page.get_by_text(seen).first.wait_for(state=state, timeout=60_000)
                    if path.split("?")[0] in ("", "evals"):  # the curves are drawn after the page's text
                        await page.locator(".vega-embed").first.wait_for(timeout=60_000)
                    name = path.split("?")[0] or "runs"
                    await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
                await page.goto(f"{url}/?run={loop.run}")
                recorded = "Agents' commands jailed (bubblewrap), as its runner recorded."
                await page.get_by_text(recorded).first.wait_for(state="visible", timeout=60_000)
                pause = page.get_by_role("button", name="Pause")
                await pause.wait_for(timeout=60_000)
                await pause.click()
                await _until(lambda: _paused(ledger, loop.run), 60, "the Pause button did not pause the run")
                await page.get_by_role("button", name="Resume").wait_for(timeout=60_000)
                await page.screenshot(path=str(SCREENSHOTS / "runs-paused.png"), full_page=True)
                await browser.close()
            await playing.terminate("test over")
    finally:
        if monitor.returncode is None:  # one that exited on its own (its port was taken) has its say above
            monitor.terminate()
        await asyncio.wait_for(monitor.wait(), 30)
        log.close()
    assert {p.name for p in SCREENSHOTS.iterdir()} >= {
        "runs.png",
        "transcripts.png",
        "checkpoints.png",
        "evals.png",
        "machines.png",
        "runs-paused.png",
    }


@pytest.mark.timeout(300)
async def test_the_dashboard_waits_out_a_ledger_outage_and_recovers_by_itself(
    stack_settings: Settings, models_dir: Path, tmp_path: Path, trained_run: str
) -> None:
    """The dashboard reads the ledger through a port that answers nothing (the outage), then through a relay
    to the real ledger on that same port (its return): the open page goes from the banner to the run without
    anyone reloading it."""
    from playwright.async_api import async_playwright

    assert CHROMIUM is not None, "CI installs Chromium (.ci/run): none was found"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    ledger_port = free_port()
    overrides = [
        f"services.postgres.port={ledger_port}" if o.startswith("services.postgres.port=") else o
        for o in monitor_overrides(stack_settings, models_dir)
    ]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "monitor.log").open("wb")
    monitor = await asyncio.create_subprocess_exec(
        ROLLOUT, "monitor", "--port", str(port), *overrides, stdout=log, stderr=asyncio.subprocess.STDOUT
    )
    relay: asyncio.Server | None = None
    try:
        await _until(lambda: _healthy(url), 120, f"the dashboard did not start: {_tail(tmp_path)}")
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(f"{url}/?run={trained_run}")
            banner = page.get_by_text("is not answering")
            await banner.wait_for(timeout=60_000)
            assert f"127.0.0.1:{ledger_port}" in await banner.inner_text()
            await page.screenshot(path=str(SCREENSHOTS / "ledger-down.png"), full_page=True)
            relay = await _relay(ledger_port, stack_settings.services.postgres.port)
            await page.get_by_text("Per step").first.wait_for(timeout=60_000)
            await page.get_by_text(trained_run).first.wait_for(state="attached", timeout=60_000)
            assert not await page.get_by_text("is not answering").count(), "the banner went away"
            await page.screenshot(path=str(SCREENSHOTS / "ledger-back.png"), full_page=True)
            await browser.close()
    finally:
        if monitor.returncode is None:  # one that exited on its own (its port was taken) has its say above
            monitor.terminate()
        await asyncio.wait_for(monitor.wait(), 30)
        log.close()
        if relay is not None:
            relay.close()


async def _relay(port: int, to_port: int) -> asyncio.Server:
    """A TCP relay on 127.0.0.1:`port` to 127.0.0.1:`to_port`."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", to_port)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    return await asyncio.start_server(connected, "127.0.0.1", port)


async def _until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.5)


async def _exists(ledger: Ledger, run: str) -> bool:
    return await find_run(ledger, run) is not None


async def _paused(ledger: Ledger, run: str) -> bool:
    found = await find_run(ledger, run)
    return found is not None and found.settings.paused


async def _healthy(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"{url}/_stcore/health", timeout=2)).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "monitor.log").read_text(errors="replace")[-2000:]
