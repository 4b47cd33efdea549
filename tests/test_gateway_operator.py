"""The gateway's operator routes over real HTTP: open on loopback, behind the operator key beyond it; a seat
token is never an operator key; a seat's id is never the client's to choose; bad bodies are named; the key
file is made once, mode 600. (Run control against a real run is in tests/test_security_stack.py.)"""

from __future__ import annotations

import stat
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest

from rollout.engines.scripted import ScriptedEngine
from rollout.gateway.operator import Operator, is_loopback, load_operator_key
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import read_all
from rollout.ledger.streams import seat_stream
from rollout.rendering import ModelRenderer
from tests.gatewayutil import RunningGateway, serve_gateway, tool_loop_script

RUN_ROUTES = ("/operator/runs/r1/pause", "/operator/runs/r1/resume", "/operator/runs/r1/max_lag")
ALL_ROUTES = ("/operator/seats", *RUN_ROUTES)


@pytest.fixture
def secret(tmp_path: Path) -> bytes:
    return load_secret(tmp_path / "gateway.secret")


@pytest.fixture
def key(tmp_path: Path) -> str:
    return load_operator_key(tmp_path)


async def _gateway(
    ledger: Ledger, renderer: ModelRenderer, key: str, secret: bytes, host: str
) -> AsyncIterator[RunningGateway]:
    operator = Operator.listening_on(host, key=key, seat_secret=secret)
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with serve_gateway(ledger, renderer, engine, wait_s=1.0, operator=operator, host=host) as running:
        yield running


@pytest.fixture
async def loopback(
    ledger: Ledger, renderer: ModelRenderer, key: str, secret: bytes
) -> AsyncIterator[RunningGateway]:
    async for running in _gateway(ledger, renderer, key, secret, "127.0.0.1"):
        yield running


@pytest.fixture
async def everywhere(
    ledger: Ledger, renderer: ModelRenderer, key: str, secret: bytes
) -> AsyncIterator[RunningGateway]:
    async for running in _gateway(ledger, renderer, key, secret, "0.0.0.0"):
        yield running


def bearer(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


def error_of(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["type"] == kind
    return str(body["error"]["message"])


async def a_seat_token(ledger: Ledger, secret: bytes) -> str:
    _, token = await open_seat(ledger, secret, seat_id=f"test-{uuid.uuid4().hex[:10]}", agent="a")
    return token


async def test_on_loopback_the_routes_are_open_but_a_key_that_is_sent_must_be_right(
    loopback: RunningGateway, ledger: Ledger, key: str, secret: bytes
) -> None:
    async with httpx.AsyncClient(base_url=loopback.url) as client:
        opened = await client.post(
            "/operator/seats", json={"agent": "remote", "run": "r-x", "episode": "e-1"}
        )
        assert opened.status_code == 201, opened.text
        with_key = await client.post("/operator/seats", json={}, headers=bearer(key))
        assert with_key.status_code == 201, with_key.text
        seat_token = await a_seat_token(ledger, secret)
        message = error_of(
            await client.post("/operator/seats", json={}, headers=bearer(seat_token)), 403, "forbidden"
        )
        assert "seat token is not an operator key" in message
        error_of(
            await client.post("/operator/seats", json={}, headers=bearer("ro-" + "0" * 48)), 403, "forbidden"
        )
    seat = opened.json()
    assert seat["seat"].startswith("manual/") and seat["api_key"].startswith("rs-")
    assert seat["base_url"] == f"{loopback.url}/s/{seat['api_key']}/v1"
    # The seat it handed out samples, and is the seat that was asked for.
    chat = openai.AsyncOpenAI(base_url=seat["base_url"], api_key="unused", max_retries=0)
    reply = await chat.chat.completions.create(model="base", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "Hello from the script."
    events = await read_all(ledger, seat_stream(seat["seat"]))
    assert [e.kind for e in events] == [Kind.SEAT_OPENED, Kind.TURN_RECORDED]
    assert {k: events[0].payload[k] for k in ("agent", "run", "episode", "policy")} == {
        "agent": "remote",
        "run": "r-x",
        "episode": "e-1",
        "policy": "default",
    }
    assert seat["api_key"] not in str(events[0].payload)  # only its SHA-256 is recorded


async def test_beyond_loopback_every_route_needs_the_operator_key(
    everywhere: RunningGateway, ledger: Ledger, key: str, secret: bytes
) -> None:
    seat_token = await a_seat_token(ledger, secret)
    async with httpx.AsyncClient(base_url=everywhere.url) as client:
        for route in ALL_ROUTES:
            missing = await client.post(route, json={})
            assert "Bearer <operator key>" in error_of(missing, 401, "unauthorized")
            assert missing.headers["www-authenticate"] == "Bearer"
            error_of(
                await client.post(route, json={}, headers={"authorization": f"Basic {key}"}),
                401,
                "unauthorized",
            )
            error_of(await client.post(route, json={}, headers=bearer(seat_token)), 403, "forbidden")
            error_of(await client.post(route, json={}, headers=bearer(key[:-1] + "x")), 403, "forbidden")
            error_of(await client.post(route, json={}, headers=bearer(key + "x")), 403, "forbidden")
        opened = await client.post("/operator/seats", json={"agent": "far"}, headers=bearer(key))
        assert opened.status_code == 201, opened.text
        # With the key, a run route gets past the door: this gateway has no run control, and says so.
        message = error_of(await client.post(RUN_ROUTES[0], headers=bearer(key)), 503, "unavailable")
        assert "without run control" in message
        # The seat routes stay the seats' own: the operator key is not a seat token.
        as_seat = await client.post(
            "/v1/chat/completions",
            json={"model": "base", "messages": [{"role": "user", "content": "hi"}]},
            headers=bearer(key),
        )
        assert as_seat.status_code == 401


async def test_a_seat_id_is_never_the_clients_to_choose(
    loopback: RunningGateway, ledger: Ledger, secret: bytes
) -> None:
    """A seat's token is derived from its id: if a client could name the id, it could get any seat's token."""
    victim = f"test-{uuid.uuid4().hex[:10]}"
    await open_seat(ledger, secret, seat_id=victim, agent="victim")
    async with httpx.AsyncClient(base_url=loopback.url) as client:
        for field in ("seat", "seat_id", "id", "token"):
            message = error_of(
                await client.post("/operator/seats", json={field: victim, "agent": "x"}),
                400,
                "invalid_request",
            )
            assert f"unknown field '{field}'" in message
        made = [(await client.post("/operator/seats", json={"agent": "x"})).json() for _ in range(2)]
    assert len({m["seat"] for m in made}) == 2 and len({m["api_key"] for m in made}) == 2
    assert victim not in {m["seat"] for m in made}
    assert (
        len(await read_all(ledger, seat_stream(victim))) == 1
    )  # the victim's stream: only its own SeatOpened


@pytest.mark.parametrize(
    ("route", "body", "named"),
    [
        ("/operator/seats", b"{not json", "not valid JSON"),
        ("/operator/seats", b"[1, 2]", "must be a JSON object"),
        ("/operator/seats", b'{"agent": 5}', "'agent' must be a non-empty string"),
        ("/operator/seats", b'{"agent": ""}', "'agent' must be a non-empty string"),
        ("/operator/seats", b'{"run": "a\\u0000b"}', "'run' must be at most 200 characters"),
        ("/operator/seats", b'{"policy": "' + b"p" * 201 + b'"}', "'policy' must be at most 200 characters"),
        ("/operator/runs/r1/max_lag", b"{}", "bad value for 'max_lag'"),
        ("/operator/runs/r1/max_lag", b'{"max_lag": -1}', "bad value for 'max_lag'"),
        ("/operator/runs/r1/max_lag", b'{"max_lag": "3"}', "bad value for 'max_lag'"),
        ("/operator/runs/r1/max_lag", b'{"max_lag": true}', "bad value for 'max_lag'"),
        ("/operator/runs/r1/max_lag", b'{"max_lag": 1, "paused": true}', "unknown field 'paused'"),
        ("/operator/runs/r1/pause", b'{"now": true}', "unknown field 'now'"),
    ],
)
async def test_bad_bodies_are_refused_naming_what_is_wrong(
    loopback: RunningGateway, route: str, body: bytes, named: str
) -> None:
    async with httpx.AsyncClient(base_url=loopback.url) as client:
        response = await client.post(route, content=body, headers={"content-type": "application/json"})
    assert named in error_of(response, 400, "invalid_request")


def test_the_operator_key_is_made_once_readable_by_its_owner_only(tmp_path: Path) -> None:
    found: list[str] = []
    threads = [threading.Thread(target=lambda: found.append(load_operator_key(tmp_path))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(found)) == 1 and found[0].startswith("ro-") and len(found[0]) == 51
    assert load_operator_key(tmp_path) == found[0]
    mode = stat.S_IMODE((tmp_path / "operator.key").stat().st_mode)
    assert mode == 0o600
    load_secret(tmp_path / "gateway.secret")
    assert stat.S_IMODE((tmp_path / "gateway.secret").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("192.168.0.5", False),
        ("gateway.example.com", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
