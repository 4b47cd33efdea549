"""Who may do what, on a running stack: the session's Postgres and Temporal, and an engine, gateway and runner
started by `Stack.up` as detached processes, logging at DEBUG, with passwords in both ledger URLs and API keys
in their environment.

- The gateway's operator routes open seats that sample, and pause, re-lag and resume a real run through its
  workflow (recorded in the ledger); an unknown run is a 404; on loopback too, none acts without the key.
- Every service the stack starts listens on loopback only, as every default says.
- Listening beyond loopback (`rollout gateway --host 0.0.0.0`), the operator routes need the operator key as
  well.
- The stack's engine answers only the engine API key (the gateway's, its follower's, `rollout status`'s): not
  a request without it, nor one with the operator key or a seat token.
- No seat token, operator key, engine key, gateway secret, API key or database password appears in any
  service's log, any ledger payload, key or projection, or any command's output but the one that hands a
  seat's key out; none is on any command line.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString, cast

import httpx
import psutil
import psycopg
import pytest

from rollout import config
from rollout.cli import engine as engine_cli
from rollout.cli import gateway as gateway_cli
from rollout.cli import sandbox as sandbox_cli
from rollout.config import Settings
from rollout.engines.vllm_launcher import VLLMLaunch
from rollout.gateway.seats import load_secret, seat_token
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import read_all
from rollout.ledger.streams import run_stream
from rollout.net import free_port
from rollout.security.keyfiles import known_ledger_password
from rollout.serving.keys import load_engine_api_key
from rollout.stack.embedded import Stack
from rollout.stack.postgres import EmbeddedPostgres
from rollout.stack.processes import wait_for_http
from rollout.stack.roles import ROLES as STACK_ROLES
from rollout.stack.temporal import EmbeddedTemporal

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT = str(Path(sys.executable).parent / "rollout")
ENVIRONMENT = "tests.example_envs:coin"

pytestmark = pytest.mark.slow


@dataclass
class SecureStack:
    settings: Settings
    overrides: list[str]
    stack: Stack
    url: str
    operator_key: str
    seat_secret: bytes
    passwords: list[str]
    api_keys: list[str]
    runs: list[str] = field(default_factory=list[str])
    handed_out: list[str] = field(default_factory=list[str])  # seat tokens given to clients


def _rollout(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ROLLOUT, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check:
        assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return done


@pytest.fixture(scope="module")
def secure(
    stack_settings: Settings, models_dir: Path, tiny_qwen3: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecureStack]:
    postgres = stack_settings.services.postgres
    # The session's server, as a server of the user's own: its roles' real passwords, given in the URLs.
    passwords = [
        known_ledger_password(stack_settings.data_path, user) or "" for user in ("postgres", "rollout_worker")
    ]
    assert all(passwords), "the embedded server made its roles' passwords"
    server = f"127.0.0.1:{postgres.port}/{postgres.database}"
    api_keys = {
        "TINKER_API_KEY": f"tml-{secrets.token_hex(12)}",
        "ANTHROPIC_API_KEY": f"sk-ant-{secrets.token_hex(12)}",
        "OPENAI_API_KEY": f"sk-proj-{secrets.token_hex(12)}",
    }
    overrides = [
        "preset=cpu-micro",
        f"data_dir={tmp_path_factory.mktemp('secure')}",
        f"models_dir={models_dir}",
        f"services.postgres.url=postgresql://postgres:{passwords[0]}@{server}",
        f"services.postgres.worker_url=postgresql://rollout_worker:{passwords[1]}@{server}",
        f"services.temporal.address={stack_settings.temporal_address}",
        "services.gateway.enabled=true",
        f"services.gateway.port={free_port()}",
        f"services.gateway.engine_port={free_port()}",
        "log_level=DEBUG",  # the most a service ever writes
    ]
    settings = config.load(overrides)
    saved = {name: os.environ.get(name) for name in api_keys}
    os.environ.update(api_keys)  # the services inherit them, as they would a user's shell's
    stack = Stack(settings, import_path=[str(ROOT)])
    try:
        stack.up()
        gateway = settings.services.gateway
        yield SecureStack(
            settings=settings,
            overrides=overrides,
            stack=stack,
            url=f"http://{gateway.host}:{gateway.port}",
            operator_key=(settings.data_path / "operator.key").read_text(),
            seat_secret=load_secret(settings.data_path / "gateway.secret"),
            passwords=passwords,
            api_keys=list(api_keys.values()),
        )
    finally:
        stack.down()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _new_seat(secure: SecureStack, client: httpx.Client, **body: Any) -> dict[str, Any]:
    made = client.post(
        "/operator/seats", json=body, headers={"authorization": f"Bearer {secure.operator_key}"}
    )
    assert made.status_code == 201, made.text
    seat = made.json()
    secure.handed_out.append(seat["api_key"])
    return seat


def _turn(client: httpx.Client, base_url: str, token: str, text: str) -> None:
    response = client.post(
        f"{base_url}/chat/completions",
        json={"model": "base", "messages": [{"role": "user", "content": text}], "max_tokens": 4},
        headers={"authorization": f"Bearer {token}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text


def _settings_changes(secure: SecureStack, run: str) -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        async with await Ledger.connect(secure.settings.ledger_url) as ledger:
            events = await read_all(ledger, run_stream(run))
        return [dict(e.payload["changes"]) for e in events if e.kind == Kind.SETTINGS_CHANGED]

    return asyncio.run(read())


def test_operator_routes_open_seats_and_control_a_real_run(secure: SecureStack) -> None:
    with httpx.Client(base_url=secure.url, timeout=120) as client:
        seat = _new_seat(secure, client, agent="remote-host")
        _turn(client, seat["base_url"], seat["api_key"], "hello")

        run = f"secure-{uuid.uuid4().hex[:6]}"
        secure.runs.append(run)
        _rollout("run", "start", ENVIRONMENT, "--run", run, *secure.overrides)
        key = {"authorization": f"Bearer {secure.operator_key}"}
        keyless = client.post(f"/operator/runs/{run}/pause")  # loopback is no key: a tunnel makes it anyone's
        assert keyless.status_code == 401 and keyless.json()["error"]["type"] == "unauthorized"
        pause = client.post(f"/operator/runs/{run}/pause", headers=key)
        assert pause.status_code == 200, pause.text
        assert pause.json()["paused"] is True and pause.json()["run"] == run
        lag = client.post(f"/operator/runs/{run}/max_lag", json={"max_lag": 3}, headers=key)
        assert lag.status_code == 200, lag.text
        assert lag.json()["max_lag"] == 3 and lag.json()["paused"] is True
        resumed = client.post(f"/operator/runs/{run}/resume", headers=key)
        assert resumed.status_code == 200 and resumed.json()["paused"] is False

        missing = client.post("/operator/runs/no-such-run/pause", headers=key)
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    # Recorded by the run's workflow, in order, as `rollout run pause|set|resume` would have.
    assert _settings_changes(secure, run) == [{"paused": True}, {"max_lag": 3}, {"paused": False}]
    _rollout("run", "stop", run, *secure.overrides)


def _listening(pid: int) -> list[tuple[str, int]]:
    """Every TCP/UDP address the process and its children listen on."""
    found: list[tuple[str, int]] = []
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            connections = process.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        # Listening TCP sockets, and UDP sockets bound but connected to nothing (they take datagrams from
        # anyone).
        found += [
            (c.laddr.ip, c.laddr.port)
            for c in connections
            if c.status == psutil.CONN_LISTEN or (c.status == psutil.CONN_NONE and not c.raddr)
        ]
    return found


def test_every_service_binds_loopback_by_default(secure: SecureStack, stack_settings: Settings) -> None:
    defaults = config.load([])
    services = defaults.services
    hosts = {
        services.postgres.host,
        services.temporal.host,
        services.gateway.host,
        services.gateway.engine_host,
    }
    assert hosts == {"127.0.0.1"}
    assert inspect.signature(sandbox_cli.serve).parameters["host"].default == "127.0.0.1"
    for command in (gateway_cli.gateway, engine_cli.serve):  # their host is the settings' (loopback, above)
        assert inspect.signature(command).parameters["host"].default is None, command
    assert VLLMLaunch("m", port=1, served_name="base", api_key="re-x").host == "127.0.0.1"

    session = stack_settings.services
    postgres = EmbeddedPostgres(stack_settings.data_path, session.postgres.host, session.postgres.port).pid()
    temporal = EmbeddedTemporal(
        data_dir=stack_settings.data_path,
        host=session.temporal.host,
        port=session.temporal.port,
        ui_port=session.temporal.ui_port,
    ).pid()
    mine = secure.settings.services.gateway
    expected = {
        "postgres": (postgres, {session.postgres.port}),
        "temporal": (temporal, {session.temporal.port, session.temporal.ui_port}),
        "engine": (_pid(secure.stack, "Engine"), {mine.engine_port}),
        "gateway": (_pid(secure.stack, "Gateway"), {mine.port}),
        "runner": (_pid(secure.stack, "Runner"), set[int]()),
    }
    # A sandbox server, as `rollout sandbox serve` starts one.
    sandbox_port = free_port()
    sandbox = subprocess.Popen(
        [
            ROLLOUT,
            "sandbox",
            "serve",
            "--name",
            f"secure-{uuid.uuid4().hex[:6]}",
            "--port",
            str(sandbox_port),
            *secure.overrides,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{sandbox_port}/health", sandbox)
        expected["sandbox"] = (sandbox.pid, {sandbox_port})
        for name, (pid, ports) in expected.items():
            assert pid is not None, f"{name} is not running"
            addresses = _listening(pid)
            assert ports <= {port for _, port in addresses}, (name, addresses)
            beyond = [a for a in addresses if not ipaddress.ip_address(a[0]).is_loopback]
            assert not beyond, f"{name} listens beyond loopback: {beyond}"
    finally:
        sandbox.terminate()
        sandbox.wait(30)


def test_temporals_web_ui_refuses_a_rebinding_page(stack_settings: Settings) -> None:
    """A page that rebinds its own name to 127.0.0.1 sends that name as Host: Temporal's UI (the dev server's
    checks none) is answered by its guard with 421, its API included; loopback's own names reach it."""
    ui = stack_settings.temporal_ui_url
    assert ui is not None
    port = ui.rsplit(":", 1)[1]
    for path in ("/", "/api/v1/namespaces"):
        refused = httpx.get(f"{ui}{path}", headers={"Host": f"rebind.example:{port}"}, timeout=10)
        assert refused.status_code == 421, (path, refused.status_code, refused.text[:200])
    assert httpx.get(ui, timeout=10).status_code == 200
    namespaces = httpx.get(f"{ui}/api/v1/namespaces", headers={"Host": f"localhost:{port}"}, timeout=10)
    assert namespaces.status_code == 200 and "default" in namespaces.text, namespaces.text[:200]


def test_services_get_the_worker_url_only_and_the_engine_stays_on_loopback(tmp_path: Path) -> None:
    """What the stack tells its processes: no owner's URL (a service that is compromised learns no password
    but its own), and an engine on loopback even when the gateway is opened to other machines."""
    settings = config.load(
        [
            f"data_dir={tmp_path}",
            "services.gateway.host=0.0.0.0",
            "services.postgres.url=postgresql://owner:pw-owner-1@db/x",
            "services.postgres.worker_url=postgresql://w:pw%3Aworker-1@db/x",
        ]
    )
    stack = Stack(settings)
    told: dict[str, config.Settings] = {}
    for name in ("Engine", "Gateway", "Runner", "Trainer", "Monitor"):
        process = stack.process(name)
        assert process is not None, name
        assert "pw-owner-1" not in " ".join(process.command), name
        assert "worker-1" not in " ".join(process.command), f"{name}: `ps` would show the worker's password"
        # What the process loads from its command line, as its command does, and the password file it gets.
        told[name] = config.load([a for a in process.command[3:] if "=" in a])
        assert told[name].services.postgres.url is None, name
        assert told[name].worker_ledger_url == "postgresql://w@db/x", name
        passfile = Path(dict(process.env)["PGPASSFILE"])
        assert passfile.read_text() == "*:*:*:w:pw\\:worker-1\n", "libpq's format, its ':' escaped"
        assert passfile.stat().st_mode & 0o777 == 0o600, name
    engine, gateway = told["Engine"].services.gateway, told["Gateway"].services.gateway
    assert engine.engine_host == "127.0.0.1" == stack.processes["Engine"].host
    assert gateway.host == "0.0.0.0" == stack.processes["Gateway"].host
    assert (gateway.engine_host, gateway.engine_port) == ("127.0.0.1", settings.services.gateway.engine_port)


def _pid(stack: Stack, role: str) -> int | None:
    process = stack.process(role)
    return process.pid() if process else None


def test_beyond_loopback_the_gateways_operator_routes_need_the_key(secure: SecureStack) -> None:
    port = free_port()
    log = secure.settings.data_path / "logs" / "gateway-everywhere.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                ROLLOUT,
                "gateway",
                "--model",
                "tiny-qwen3",
                "--host",
                "0.0.0.0",
                "--port",
                str(port),
                "--engine-url",
                f"http://127.0.0.1:{secure.settings.services.gateway.engine_port}",
                *secure.overrides,
            ],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_http(f"{url}/health", process)
        with httpx.Client(base_url=url, timeout=60) as client:
            refused = client.post("/operator/seats", json={})
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "unauthorized"
            forged = client.post(
                "/operator/seats", json={}, headers={"authorization": "Bearer ro-" + "0" * 48}
            )
            assert forged.status_code == 403
            seat = _new_seat(secure, client, agent="far-away")
            as_key = client.post(
                "/operator/seats", json={}, headers={"authorization": f"Bearer {seat['api_key']}"}
            )
            assert as_key.status_code == 403
            _turn(client, f"{url}/s/{seat['api_key']}/v1", seat["api_key"], "hi from afar")
    finally:
        process.terminate()
        process.wait(30)
    assert "operator routes need the key in" in log.read_text()


def test_the_stacks_engine_answers_only_the_engine_api_key(secure: SecureStack) -> None:
    """A process of another user on the machine, or a page through a tunnel, reaches the engine's port:
    without the engine API key it loads no adapter, puts the engine to sleep or samples on it, whatever key it
    sends; the gateway's turns and `rollout status` (which sends the key) still reach it."""
    engine_url = f"http://127.0.0.1:{secure.settings.services.gateway.engine_port}"
    key = load_engine_api_key(secure.settings.data_path)
    with httpx.Client(base_url=secure.url, timeout=120) as client:
        seat = _new_seat(secure, client, agent="engine-attacker")
        _turn(client, seat["base_url"], seat["api_key"], "through the gateway")
    with httpx.Client(base_url=engine_url, timeout=60) as engine:
        for headers in (
            {},
            {"authorization": f"Bearer {secure.operator_key}"},
            {"authorization": f"Bearer {seat['api_key']}"},
        ):
            loaded = engine.post(
                "/v1/load_lora_adapter", json={"lora_name": "base-2", "lora_path": "/tmp"}, headers=headers
            )
            assert loaded.status_code == 401, loaded.text
            assert engine.post("/sleep", headers=headers).status_code == 401
            sampled = engine.post(
                "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, headers=headers
            )
            assert sampled.status_code == 401
        assert engine.get("/health").status_code == 200
        keyed = engine.get("/is_sleeping", headers={"authorization": f"Bearer {key}"})
        assert keyed.json() == {"is_sleeping": False}
    status = json.loads(_rollout("status", "--json", *secure.overrides, check=False).stdout)
    (probed,) = [s for s in status["services"] if s["name"] == "engine"]
    assert probed["detail"].startswith("serving "), probed


def _all_secrets(secure: SecureStack) -> dict[str, str]:
    """Every secret of the stack, named for the failure message: the operator key, the engine key and the
    engine API key, the seat secret, passwords, API keys, and the token of every seat opened (by hand, through
    the operator routes, by the runner)."""
    found = {
        "operator key": secure.operator_key,
        "engine key": (secure.settings.data_path / "engine.key").read_text().strip(),
        "engine API key": load_engine_api_key(secure.settings.data_path),
        "gateway secret (hex)": secure.seat_secret.hex(),
        **{f"password {i}": password for i, password in enumerate(secure.passwords)},
        **{f"API key {i}": key for i, key in enumerate(secure.api_keys)},
    }
    with psycopg.connect(secure.settings.ledger_url) as conn:
        seats = conn.execute(
            "SELECT seat_id FROM seat WHERE run_id = ANY(%s) OR seat_id LIKE 'manual/%%'", (secure.runs,)
        ).fetchall()
    tokens = {seat_token(secure.seat_secret, seat_id) for (seat_id,) in seats} | set(secure.handed_out)
    assert len(tokens) >= 4, "the runs opened no seats: nothing would be checked"
    found |= {f"seat token {i}": token for i, token in enumerate(sorted(tokens))}
    return found


def test_no_secret_is_written_in_clear_anywhere(secure: SecureStack, stack_settings: Settings) -> None:
    # Traffic that would carry secrets: a seat handed out by the CLI, turns through it and through a wrong
    # key, a whole run played by the runner (its agents sample through their seats' URLs).
    handed = _rollout("seat", "new", "--gateway-url", secure.url, "--json", *secure.overrides)
    seat = json.loads(handed.stdout)
    secure.handed_out.append(seat["api_key"])
    with httpx.Client(timeout=120) as client:
        _turn(client, seat["base_url"], seat["api_key"], "a turn")
        wrong = client.post(
            f"{secure.url}/s/{seat['api_key'][:-2]}00/v1/chat/completions",
            json={"model": "base", "messages": [{"role": "user", "content": "x"}]},
        )
        assert wrong.status_code == 401
    run = f"secure-{uuid.uuid4().hex[:6]}"
    secure.runs.append(run)
    played = _rollout(
        "run", "start", ENVIRONMENT, "--run", run, "--groups", "1", "--wait", "--json", *secure.overrides
    )
    assert json.loads(played.stdout)["episodes_finished"] == 4
    outputs = {
        "run start": played.stdout + played.stderr,
        "seat new (stderr)": handed.stderr,
        "status": (s := _rollout("status", "--json", *secure.overrides, check=False)).stdout + s.stderr,
        "config show": _rollout("config", "show", *secure.overrides).stdout,
        "run list": _rollout("run", "list", "--json", *secure.overrides).stdout,
        "ledger tail": _rollout("ledger", "tail", f"seat/{seat['seat']}", *secure.overrides).stdout,
    }
    assert "pw-owner-" not in outputs["config show"] and "postgres:***@" in outputs["config show"]

    every = _all_secrets(secure)
    logs = {
        path: path.read_bytes()
        for root in (secure.settings.data_path, stack_settings.data_path)
        for path in (root / "logs").glob("*.log")
    }
    assert {"engine.log", "gateway.log", "runner.log"} <= {p.name for p in logs}
    assert sum(len(text) for text in logs.values()) > 10_000, "the services logged next to nothing at DEBUG"
    leaks = [
        f"{name} in {path}"
        for name, secret in every.items()
        for path, text in logs.items()
        if secret.encode() in text
    ]
    leaks += [f"gateway secret (raw) in {path}" for path, text in logs.items() if secure.seat_secret in text]
    leaks += [
        f"{name} in `rollout {cmd}`"
        for name, secret in every.items()
        for cmd, text in outputs.items()
        if secret in text
    ]
    # The one output that hands a key out holds that key, and no other secret.
    leaks += [
        f"{name} in `rollout seat new`"
        for name, secret in every.items()
        if secret in handed.stdout and secret != seat["api_key"]
    ]
    assert seat["api_key"] in handed.stdout
    with psycopg.connect(secure.settings.ledger_url) as conn:
        for name, secret in every.items():
            for table, text in (
                ("event", "stream_id || idempotency_key || payload::text"),
                ("seat", "seat_id || coalesce(run_id, '') || agent || policy"),
                ("run", "run_id || settings::text"),
                ("lease", "resource || holder"),
            ):
                query = cast(LiteralString, f"SELECT count(*) FROM {table} WHERE strpos({text}, %s) > 0")
                row = conn.execute(query, (secret,)).fetchone()
                if row and row[0]:
                    leaks.append(f"{name} in {row[0]} {table} row(s) of the ledger")
    # `ps -eo args`: every service of the stack, and what it started, run with no secret on its command line.
    services = [
        psutil.Process(pid) for role in [r.name for r in STACK_ROLES] if (pid := _pid(secure.stack, role))
    ]
    assert len(services) >= 3, "the stack's services run"
    for process in [
        *services,
        *(child for service in services for child in service.children(recursive=True)),
    ]:
        args = " ".join(process.cmdline())
        leaks += [
            f"{name} on the command line of {process.pid}" for name, secret in every.items() if secret in args
        ]
    assert not leaks, "\n".join(leaks)
