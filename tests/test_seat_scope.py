"""A seat's token reaches its own turns only. Seat A, sending exactly what seat B sent (the same request,
hence the same turn key; B's history and B's replies, hence B's segment; retries of it; streamed and not),
never gets B's recorded reply, never extends B's segment and never writes to B's stream; B's turns stay as B
recorded them, and replay for B alone."""

from __future__ import annotations

import hashlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout.contracts import Message
from rollout.engines.scripted import ScriptedEngine
from rollout.gateway.seats import close_seat, load_secret, open_seat
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import read_all
from rollout.ledger.streams import seat_stream
from rollout.rendering import ModelRenderer
from tests.gatewayutil import RunningGateway, serve_gateway


@pytest.fixture
async def running(ledger: Ledger, renderer: ModelRenderer) -> AsyncIterator[RunningGateway]:
    # Every sample is a new reply: a reply that comes back twice was replayed, not sampled.
    counter = itertools.count(1)
    engine = ScriptedEngine(renderer, lambda prompt: Message.assistant(f"sample {next(counter)}"))
    async with serve_gateway(ledger, renderer, engine, wait_s=1.0) as running:
        yield running


@pytest.fixture
async def seats(ledger: Ledger, tmp_path: Path) -> dict[str, tuple[str, str]]:
    secret = load_secret(tmp_path / "gateway.secret")
    made = {}
    for name in ("a", "b"):
        seat_id = f"test-{name}-{uuid.uuid4().hex[:10]}"
        _, token = await open_seat(ledger, secret, seat_id=seat_id, agent=name)
        made[name] = (seat_id, token)
    return made


async def snapshot(ledger: Ledger, seat_id: str) -> list[tuple[int, str, str]]:
    """The seat's stream exactly: seq, key and a hash of each payload."""
    return [
        (e.seq, e.key, hashlib.sha256(json.dumps(e.payload, sort_keys=True).encode()).hexdigest())
        for e in await read_all(ledger, seat_stream(seat_id))
    ]


async def chat(client: httpx.AsyncClient, token: str, messages: list[dict[str, Any]], **more: Any) -> str:
    response = await client.post(
        f"/s/{token}/v1/chat/completions", json={"model": "base", "messages": messages, **more}
    )
    assert response.status_code == 200, response.text
    if more.get("stream"):
        deltas = [
            choice["delta"].get("content") or ""
            for line in response.text.splitlines()
            if line.startswith("data: {")
            for choice in json.loads(line[6:])["choices"]
        ]
        return "".join(deltas)
    return str(response.json()["choices"][0]["message"]["content"])


async def test_the_same_request_from_another_seat_is_sampled_for_it_not_replayed_from_b(
    running: RunningGateway, seats: dict[str, tuple[str, str]], ledger: Ledger
) -> None:
    (a_id, a_token), (b_id, b_token) = seats["a"], seats["b"]
    first: list[dict[str, Any]] = [{"role": "user", "content": "what is 1 + 1?"}]
    async with httpx.AsyncClient(base_url=running.url) as client:
        b_reply = await chat(client, b_token, first)
        b_before = await snapshot(ledger, b_id)

        # A sends B's request (same turn index, same fingerprint: the same turn key), by every way a token
        # travels, streamed and not, retried.
        a_reply = await chat(client, a_token, first)
        assert a_reply != b_reply
        assert await chat(client, a_token, first) == a_reply  # A's retry replays A's own turn
        assert await chat(client, a_token, first, stream=True) == a_reply
        for headers in ({"x-api-key": a_token}, {"authorization": f"Bearer {a_token}"}):
            response = await client.post(
                "/v1/chat/completions", json={"model": "base", "messages": first}, headers=headers
            )
            assert response.json()["choices"][0]["message"]["content"] == a_reply

        # A sends B's history with B's reply: it continues no segment of B's; it starts one of its own.
        second = [
            *first,
            {"role": "assistant", "content": b_reply},
            {"role": "user", "content": "and 2 + 2?"},
        ]
        a_second = await chat(client, a_token, second)
        assert await chat(client, a_token, second, stream=True) == a_second

        # B's stream is exactly as B left it, and B still replays its own reply.
        assert await snapshot(ledger, b_id) == b_before
        assert await chat(client, b_token, first) == b_reply
        assert await snapshot(ledger, b_id) == b_before

    a_turns = [e.payload for e in await read_all(ledger, seat_stream(a_id)) if e.kind == Kind.TURN_RECORDED]
    assert len(a_turns) == 2 and all(t["seat"] == a_id for t in a_turns)
    assert all(str(t["segment_id"]).startswith(f"{a_id}/") for t in a_turns)
    assert a_turns[1]["prompt_prefix_len"] == 0  # a new segment: nothing reused from B's tokens
    b_turns = [e.payload for e in await read_all(ledger, seat_stream(b_id)) if e.kind == Kind.TURN_RECORDED]
    assert [t["seat"] for t in b_turns] == [b_id]


async def test_a_finished_seat_stays_finished_whoever_asks_and_the_other_seat_goes_on(
    running: RunningGateway, seats: dict[str, tuple[str, str]], ledger: Ledger
) -> None:
    (_, a_token), (b_id, b_token) = seats["a"], seats["b"]
    first: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    async with httpx.AsyncClient(base_url=running.url) as client:
        b_reply = await chat(client, b_token, first)
        await close_seat(ledger, b_id)
        before = await snapshot(ledger, b_id)
        # B's recorded turn is not served again once B is finished, not even as a replay.
        refused = await client.post(
            f"/s/{b_token}/v1/chat/completions", json={"model": "base", "messages": first}
        )
        assert refused.status_code == 410
        # A's token with B's path: the path names the seat, and A's token in a header does not widen it.
        mixed = await client.post(
            f"/s/{b_token}/v1/chat/completions",
            json={"model": "base", "messages": first},
            headers={"authorization": f"Bearer {a_token}"},
        )
        assert mixed.status_code == 410
        assert await chat(client, a_token, first) != b_reply
    assert await snapshot(ledger, b_id) == before


async def test_an_unknown_token_reaches_nothing(
    running: RunningGateway, seats: dict[str, tuple[str, str]], ledger: Ledger
) -> None:
    b_id, b_token = seats["b"]
    first: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    async with httpx.AsyncClient(base_url=running.url) as client:
        await chat(client, b_token, first)
        before = await snapshot(ledger, b_id)
        # A token one character off B's, and B's seat id in every place a client might put it.
        forged = b_token[:-1] + ("0" if b_token[-1] != "0" else "1")
        for token in (forged, b_id, f"rs-{b_id}"):
            response = await client.post(
                f"/s/{token}/v1/chat/completions",
                json={"model": "base", "messages": first, "user": b_id, "metadata": {"seat": b_id}},
            )
            assert response.status_code == 401
    assert await snapshot(ledger, b_id) == before
