"""The gateway's operator routes over real HTTP: behind the operator key wherever the gateway listens; a seat
token is never an operator key; on loopback a foreign Host is refused, and a body that is not JSON everywhere;
a seat's id is never the client's to choose; bad bodies are named; the key file is made once, mode 600; a
path or method the gateway does not serve is answered in JSON. (Run control against a real run is in
tests/test_security_stack.py.)"""

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
from rollout.gateway.operator import Operator, load_operator_key
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import read_all
from rollout.ledger.streams import seat_stream
from rollout.rendering import ModelRenderer
from rollout.security.http_guard import Hosts, is_loopback
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
    operator = Operator(key=key, seat_secret=secret)
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


async def test_on_loopback_too_every_route_needs_the_key_a_loopback_host_and_a_json_body(
    loopback: RunningGateway, ledger: Ledger, key: str, secret: bytes
) -> None:
    """A proxy or tunnel in front of a loopback port makes it anyone's, and a web page can post to it."""
    seat_token = await a_seat_token(ledger, secret)
    async with httpx.AsyncClient(base_url=loopback.url) as client:
        for route in ALL_ROUTES:
            missing = await client.post(route, json={})
            assert "Bearer <operator key>" in error_of(missing, 401, "unauthorized")
            error_of(await client.post(route, json={}, headers=bearer(seat_token)), 403, "forbidden")
            rebound = {**bearer(key), "host": f"evil.example:{loopback.url.rsplit(':', 1)[1]}"}
            assert "not 'evil.example" in error_of(
                await client.post(route, json={}, headers=rebound), 421, "invalid_request_error"
            )
            for kind in ("text/plain", "application/x-www-form-urlencoded"):
                form = {**bearer(key), "content-type": kind}
                refused = await client.post(route, content=b'{"agent": "x"}', headers=form)
                assert "Content-Type: application/json" in error_of(refused, 415, "unsupported_media_type")
        # A body-less POST without a Content-Type is what any web page may send across origins: its Origin
        # gives it away.
        page = {**bearer(key), "origin": "http://evil.example"}
        error_of(await client.post(RUN_ROUTES[0], headers=page), 415, "unsupported_media_type")
        opened = await client.post(
            "/operator/seats",
            content=b'{"agent": "remote", "run": "r-x", "episode": "e-1"}',
            headers={**bearer(key), "content-type": "application/json; charset=utf-8"},
        )
        assert opened.status_code == 201, opened.text
        # With the key and no body, a run route gets past the door: this gateway has no run control.
        assert "without run control" in error_of(
            await client.post(RUN_ROUTES[0], headers=bearer(key)), 503, "unavailable"
        )
        error_of(
            await client.post("/operator/seats", json={}, headers=bearer("ro-" + "0" * 48)), 403, "forbidden"
        )
        # What the gateway does not serve is answered in JSON too, in the dialect's shape.
        assert "nothing is served at /operator/nope" in error_of(
            await client.post("/operator/nope", json={}, headers=bearer(key)), 404, "not_found_error"
        )
        wrong_method = await client.get("/operator/seats", headers=bearer(key))
        assert "does not take GET: use POST" in error_of(wrong_method, 405, "invalid_request_error")
        assert wrong_method.headers["allow"] == "POST"
        anthropic_shaped = await client.get("/v1/messages")
        assert anthropic_shaped.status_code == 405
        assert anthropic_shaped.json()["type"] == "error"
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
        # Beyond loopback it is reached by names it cannot know (a Service, an ingress): any Host.
        opened = await client.post(
            "/operator/seats", json={"agent": "far"}, headers={**bearer(key), "host": "gateway.example"}
        )
        assert opened.status_code == 201, opened.text
        # The seat routes stay the seats' own: the operator key is not a seat token.
        as_seat = await client.post(
            "/v1/chat/completions",
            json={"model": "base", "messages": [{"role": "user", "content": "hi"}]},
            headers=bearer(key),
        )
        assert as_seat.status_code == 401


async def test_a_seat_id_is_never_the_clients_to_choose(
    loopback: RunningGateway, ledger: Ledger, key: str, secret: bytes
) -> None:
    """A seat's token is derived from its id: if a client could name the id, it could get any seat's token."""
    victim = f"test-{uuid.uuid4().hex[:10]}"
    await open_seat(ledger, secret, seat_id=victim, agent="victim")
    async with httpx.AsyncClient(base_url=loopback.url) as client:
        for field in ("seat", "seat_id", "id", "token"):
            message = error_of(
                await client.post("/operator/seats", json={field: victim, "agent": "x"}, headers=bearer(key)),
                400,
                "invalid_request",
            )
            assert f"unknown field '{field}'" in message
        made = [
            (await client.post("/operator/seats", json={"agent": "x"}, headers=bearer(key))).json()
            for _ in range(2)
        ]
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
    loopback: RunningGateway, key: str, route: str, body: bytes, named: str
) -> None:
    async with httpx.AsyncClient(base_url=loopback.url) as client:
        response = await client.post(
            route, content=body, headers={**bearer(key), "content-type": "application/json"}
        )
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


@pytest.mark.parametrize(
    ("header", "answered"),
    [
        ("127.0.0.1:8000", True),
        ("127.9.9.9", True),
        ("localhost:8000", True),
        ("[::1]:8000", True),
        ("evil.example", False),
        ("evil.example:8000", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.nip.io:8000", False),
        ("", False),
        (None, False),
    ],
)
def test_which_hosts_a_server_on_loopback_answers_to(header: str | None, answered: bool) -> None:
    assert Hosts.bound_to("127.0.0.1").allows(header) is answered
    assert Hosts.bound_to("0.0.0.0").allows(header), "beyond loopback, any"
