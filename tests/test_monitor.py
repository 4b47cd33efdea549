"""The dashboard's views with Streamlit's AppTest, against the real ledger of the session's stack holding a
short real training run (tiny model, two steps, each checkpoint scored by an eval): what a person would see in
each view, and the pages for a run that does not exist and for a ledger that is down."""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from rollout.config import Settings
from rollout.monitor.context import OVERRIDES_VARIABLE
from rollout.monitor.plain import plain
from rollout.net import free_port
from rollout.workflows.names import run_policy
from rollout_testing.otlp_receiver import OtlpReceiver

APP = str(Path(__file__).resolve().parent.parent / "rollout" / "monitor" / "app.py")


@pytest.fixture(autouse=True)
def main_module_kept() -> Iterator[None]:
    """Every AppTest run leaves its script installed as `__main__` (Streamlit's script runner does so): a
    process a later test spawns in this worker would run that script instead of its own. Put back after each
    test, whichever of its runs left it."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


def view(name: str, settings: Settings, **params: str) -> AppTest:
    """One view rendered against `settings`' ledger, with the page's query parameters."""

    def script(name: str, settings: object) -> None:
        import importlib

        from rollout.config import Settings
        from rollout.monitor.context import Monitor

        assert isinstance(settings, Settings)
        importlib.import_module(f"rollout.monitor.{name}").render(Monitor(settings))

    return opened(AppTest.from_function(script, args=(name, settings), default_timeout=60), **params)


def opened(app: AppTest, **params: str) -> AppTest:
    """`app` run once with the page's query parameters; it must draw without an exception."""
    for key, value in params.items():
        app.query_params[key] = value
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def table_text(app: AppTest) -> str:
    return " ".join(frame.value.to_csv() for frame in app.dataframe)


def test_runs_shows_the_run_its_steps_and_curves(monitor_settings: Settings, trained_run: str) -> None:
    app = view("runs", monitor_settings, run=trained_run)
    assert app.title[0].value == "Runs"
    assert trained_run in table_text(app)
    (runs_table, *_) = app.dataframe
    row = runs_table.value.set_index("run").loc[trained_run]
    assert row["steps"] == 2 and row["episodes"] > 0 and row["episodes/s"] > 0, row
    assert row["state"] == "completed", "every run's state, from one Temporal listing"
    evals = runs_table.value[runs_table.value["kind"] == "eval"]
    assert len(evals) >= 2 and set(evals["state"]) == {"completed"}, "an eval run's state is its supply's"
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["steps"] == "2" and int(metrics["episodes"]) > 0
    (curves,) = app.get("vega_lite_chart")
    spec = str(curves.proto)
    assert "reward" in spec and "mismatch KL" in spec and "effective sample size" in spec, (
        "the per-step curves"
    )
    # Every curve named in the chart is drawn, so ask its data: the trainer's entropy and the reply lengths.
    from rollout.ledger import Ledger
    from rollout.ledger.views import run_steps
    from rollout.monitor.runs import step_curves

    async def steps() -> list[Any]:
        async with await Ledger.connect(monitor_settings.ledger_url) as ledger:
            return await run_steps(ledger, trained_run)

    long, _ = step_curves(trained_run, asyncio.run(steps()))
    drawn = {p["curve"] for p in long if p["value"] is not None}
    assert {"entropy (nats)", "reply tokens (mean)"} <= drawn, drawn


def test_transcripts_show_a_seats_turns_with_coloured_tokens(
    monitor_settings: Settings, trained_run: str, otlp_receiver: OtlpReceiver
) -> None:
    app = view("transcripts", monitor_settings, run=trained_run)
    assert trained_run in table_text(app)
    coloured = [element for element in app.get("html")]
    assert coloured, "the sampled tokens, coloured"
    assert "logprob" in str(coloured[0].proto)
    assert any("sampled by" in c.value for c in app.caption)
    [named] = [c.value for c in app.caption if c.value.startswith("trace id ")]
    assert named.split()[2] in {s.trace_id for s in otlp_receiver.of_run(trained_run)}, "its spans' trace"
    app.toggle[0].set_value(True).run()
    assert not app.exception


def test_the_checkpoint_tree_draws_every_step_with_its_eval(
    monitor_settings: Settings, trained_run: str
) -> None:
    app = view("checkpoints", monitor_settings, run=trained_run)
    (graph,) = app.get("graphviz_chart")
    policy = run_policy(trained_run, "default")
    spec = str(graph.proto)
    assert f"{policy}-step000001" in spec and f"{policy}-step000002" in spec and "peripheries=2" in spec
    assert "lora" in table_text(app), "each checkpoint's bridge"


def test_evals_plot_and_tabulate_the_scores(monitor_settings: Settings, trained_run: str) -> None:
    app = view("evals", monitor_settings)
    assert app.get("vega_lite_chart"), "scores across checkpoints"
    assert len(app.dataframe) == 1


def test_machines_list_services_workers_and_leases(monitor_settings: Settings, trained_run: str) -> None:
    app = view("machines", monitor_settings)
    text = table_text(app)
    assert "postgres" in text and "temporal" in text
    assert "rollout-runner" in text, "the workers polling each queue"
    assert f"trainer/{run_policy(trained_run, 'default')}" in text, "the run's trainer lease"
    app.selectbox(key="workflows_of").set_value(trained_run).run()
    (workflows,) = [f.value for f in app.dataframe if "workflow" in f.value.columns]
    links = dict(zip(workflows["workflow"], workflows["Temporal web UI"], strict=True))
    assert f"run/{trained_run}" in links and f"run/{trained_run}/supply" in links, list(links)
    assert links[f"run/{trained_run}"].endswith(f"/workflows/run%2F{trained_run}"), "a link into the web UI"
    (services,) = [f.value for f in app.dataframe if "service" in f.value.columns]
    modes = dict(zip(services["service"], services["mode"], strict=True))
    assert modes["temporal"] == "embedded" and modes["postgres"] == "embedded", modes
    page = httpx.get(links[f"run/{trained_run}"], timeout=30, follow_redirects=True)
    assert page.status_code == 200 and "<html" in page.text.lower(), "the link opens the Temporal web UI"


def shown(markdown: str) -> str:
    """What a markdown element's source renders to (CommonMark, as Streamlit reads it)."""
    return MarkdownIt("commonmark").render(markdown)


def read_as(markdown: str) -> str:
    """The text a person reads in `markdown` once rendered (tags gone, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", shown(markdown))).strip()


BEACON = "![x](http://127.0.0.1:9/beacon) [y](http://127.0.0.1:9/) `z` <img src=x> :red[w] $m$"


def test_text_from_the_ledger_shows_as_written_never_as_markdown() -> None:
    """A model's reply, tool call or error reaches the dashboard: an image there would be fetched by the
    browser of whoever reads the transcript, from a server the model names."""
    rendered = shown(f"tool call **{plain('shell')}** {plain(BEACON)}")
    assert "<img" not in rendered and "<a " not in rendered and "<code>" not in rendered, rendered
    assert read_as(f"tool call **{plain('shell')}** {plain(BEACON)}") == f"tool call shell {BEACON}"
    assert "<img" in shown(BEACON), "the check can fail: unescaped, the same text is an image"


def test_a_run_that_does_not_exist_is_a_sentence(monitor_settings: Settings, trained_run: str) -> None:
    app = view("runs", monitor_settings, run="no-such-run")
    assert any("no run 'no-such-run'" in shown(w.value) for w in app.warning)
    hostile = view("transcripts", monitor_settings, run=BEACON)
    (warning,) = hostile.warning
    assert "<img" not in shown(warning.value) and "<a " not in shown(warning.value)


def test_a_ledger_that_is_down_is_a_banner_naming_it(
    stack_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = [f"data_dir={stack_settings.data_dir}", f"services.postgres.port={free_port()}"]
    monkeypatch.setenv(OVERRIDES_VARIABLE, json.dumps(overrides))
    app = AppTest.from_file(APP, default_timeout=60)
    app.run()
    assert not app.exception
    (banner,) = app.error
    assert "is not answering" in banner.value and "127.0.0.1:" in banner.value


def websocket_status(port: int, host: str) -> int:
    """The status the dashboard answers a websocket upgrade of its stream to, sent with `Host: host`."""
    import base64
    import os
    import socket

    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://{host}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request.encode())
        status_line = connection.recv(4096).split(b"\r\n", 1)[0].decode()
    return int(status_line.split()[1])


@pytest.mark.slow
def test_rollout_up_runs_the_dashboard_as_a_supervised_service(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from rollout.stack.processes import read_pid_file
    from rollout_testing.stacks import isolated_overrides

    rollout = str(Path(sys.executable).parent / "rollout")
    overrides = isolated_overrides(tmp_path / "data", monitor=True)

    def status() -> dict[str, dict[str, object]]:
        done = subprocess.run(
            [rollout, "status", "--json", *overrides], capture_output=True, text=True, timeout=120
        )
        return {s["name"]: s for s in json.loads(done.stdout)["services"]}

    try:
        up = subprocess.run([rollout, "up", *overrides], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stderr[-3000:]
        monitor = status()["monitor"]
        assert monitor["healthy"] and str(monitor["address"]).startswith("http://127.0.0.1:")
        page = httpx.get(f"{monitor['address']}/", timeout=10)
        assert page.status_code == 200 and "streamlit" in page.text.lower()
        # A web page that rebinds its own name to 127.0.0.1 sends that name: the dashboard's websocket (all
        # its data and actions) is refused to it, as the gateway refuses it.
        port = int(str(monitor["address"]).rsplit(":", 1)[1])
        assert websocket_status(port, f"127.0.0.1:{port}") == 101
        assert websocket_status(port, f"rebound.example:{port}") == 403
        pid = read_pid_file(tmp_path / "data" / "run" / "monitor.pid")
        assert pid is not None
        os.kill(pid.pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not ((again := status()["monitor"])["healthy"] and again["restarts"] == 1):
            assert time.monotonic() < deadline, f"the supervisor did not restart the dashboard: {again}"
            time.sleep(1)
    finally:
        down = subprocess.run([rollout, "down", *overrides], capture_output=True, text=True, timeout=300)
    assert "monitor" in down.stdout


def test_a_dashboard_with_a_token_shows_nothing_before_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound beyond loopback, the dashboard shows every transcript and pauses runs: it needs a login."""
    token = "rm-" + "x" * 40

    def page() -> None:
        import streamlit as st

        from rollout.monitor.login import logged_in

        if logged_in():
            st.markdown("every transcript")

    def login_page(**params: str) -> AppTest:
        return opened(AppTest.from_function(page, default_timeout=30), **params)

    def shows_data(app: AppTest) -> bool:
        return any("every transcript" in m.value for m in app.markdown)

    monkeypatch.setenv("ROLLOUT_MONITOR_TOKEN", token)
    bare = login_page()
    assert not shows_data(bare) and bare.text_input, "the form, and nothing else"
    wrong = login_page(token="rm-guess")
    assert not shows_data(wrong) and any("not the dashboard's token" in e.value for e in wrong.error)
    assert shows_data(login_page(token=token))
    typed = login_page()
    typed.text_input[0].set_value(token).run()
    assert shows_data(typed)
    monkeypatch.delenv("ROLLOUT_MONITOR_TOKEN")
    assert shows_data(login_page()), "on loopback, with no token set, there is no login"
    refused = subprocess.run(
        [str(Path(sys.executable).parent / "rollout"), "monitor", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "ROLLOUT_MONITOR_TOKEN" in refused.stderr, refused.stderr


def test_each_trained_policys_curves_are_drawn_side_by_side() -> None:
    from datetime import UTC, datetime, timedelta

    from rollout.ledger.views import StepRow
    from rollout.monitor.runs import step_curves

    start = datetime.now(UTC)
    steps = [
        StepRow(f"r/{policy}", version, f"r/{policy}-step{version:06d}", None, {"reward_mean": 0.5}, at)
        for policy, version, at in [
            ("speaker", 1, start),
            ("listener", 1, start + timedelta(seconds=1)),
            ("speaker", 2, start + timedelta(seconds=10)),
        ]
    ]
    points, chart = step_curves("r", steps)
    assert chart["facet"]["column"] == {
        "field": "policy",
        "type": "nominal",
        "title": None,
        "sort": ["listener", "speaker"],
    }
    times = [(p["policy"], p["step"], p["value"]) for p in points if p["curve"] == "step time (s)"]
    assert times == [("speaker", 2, 10.0)], "each policy's step time, from its own step before"
    _, alone = step_curves("r", steps[:1])
    assert "column" not in alone["facet"], "one policy: one column, as before"
