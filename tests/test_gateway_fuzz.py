"""The gateway, fuzzed from its own OpenAPI document against a real model: bodies the document accepts, the
same bodies one step away, and arbitrary JSON, on every dialect route. No answer is a 5xx; every error is one
the document lists for that route, in the shape it documents (the dialect's own); a body the document accepts
is answered, or refused only for what no schema can see (a prompt longer than the context, say)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from rollout.engines.local import LocalEngine
from rollout.gateway.openapi import document
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import run_stream
from rollout.rendering import ModelRenderer
from tests.gatewayutil import RunningGateway, serve_gateway
from tests.schema_strategies import JSON, MUTATIONS, REMOVE, accepted, paths, replaced

MAX_CONTEXT = 512
TURN_TOKENS = 4  # the seat's run caps each turn: the random model samples a few tokens, whatever was asked
DOC = document(max_context=MAX_CONTEXT)
SCHEMAS = DOC["components"]["schemas"]
ROUTES = sorted(path for path, item in DOC["paths"].items() if "post" in item and not path.startswith("/s/"))


# Why a body the document accepts may still be refused: what only the mapped request shows.
BEYOND_SCHEMA = (
    "the model's context is",  # the rendered prompt is longer than the context
    "must hold at least one",  # nothing the model can read: an input of reasoning items, no instructions
    "not supported by this model",  # an image or a document for a text-only model
    "holds a NUL character",  # JSON allows \u0000 in a string; the ledger (Postgres text) cannot hold it
    "which no earlier assistant message made",  # a tool result answers a call never made (the APIs' 400)
)


def _request_schema(route: str) -> dict[str, Any]:
    return DOC["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, Any]:
    route = draw(st.sampled_from(ROUTES))
    kind = draw(st.sampled_from(["accepted", "mutated", "arbitrary"]))
    if kind == "arbitrary":
        return route, kind, draw(JSON)
    body = draw(accepted(_request_schema(route), SCHEMAS))
    if kind == "mutated":
        where = draw(st.sampled_from(paths(body)))
        new = draw(MUTATIONS)
        body = replaced(body, where, None if (new is REMOVE and not where) else new)
    return route, kind, body


@pytest.fixture(scope="module")
def engine(tiny_qwen3: str) -> LocalEngine:
    return LocalEngine(tiny_qwen3, device="cpu")


@pytest.fixture
async def running(ledger: Ledger, engine: LocalEngine) -> AsyncIterator[RunningGateway]:
    renderer = ModelRenderer(engine.tokenizer, "qwen3")
    async with serve_gateway(ledger, renderer, engine, max_context=MAX_CONTEXT) as running:
        yield running


@pytest.fixture
async def token(ledger: Ledger, tmp_path: Path) -> str:
    run = f"fuzz-{uuid.uuid4().hex[:8]}"
    settings = {"max_tokens": TURN_TOKENS}
    await ledger.append_one(
        run_stream(run),
        NewEvent("created", Kind.RUN_CREATED, {"run": run, "environment": "e", "settings": settings}),
    )
    _, token = await open_seat(
        ledger, load_secret(tmp_path / "secret"), seat_id=f"{run}/a", agent="a", run=run
    )
    return token


async def test_the_served_document_is_the_one_fuzzed(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url) as http:
        served = (await http.get("/openapi.json")).json()
    assert served == json.loads(json.dumps(DOC))
    assert served["openapi"].startswith("3.1")
    assert len(ROUTES) == 4


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    # No shrinking: each example is an HTTP turn of a real model, and the failing body is printed whole.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@given(case=cases())
async def test_no_body_gets_a_5xx_and_every_error_is_in_its_dialects_shape(
    running: RunningGateway, token: str, case: tuple[str, str, Any]
) -> None:
    route, kind, body = case
    async with httpx.AsyncClient(base_url=running.url, timeout=60) as http:
        response = await http.post(
            f"/s/{token}{route}",
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
    status = response.status_code
    event(f"{route} {kind}: {status}")  # the mix, with --hypothesis-show-statistics
    assert status < 500, f"{status} for {json.dumps(body)[:500]}: {response.text[:500]}"
    if status == 200:
        return
    documented = DOC["paths"][route]["post"]["responses"]
    assert str(status) in documented, f"{status} is not a documented answer of {route}"
    shape = {
        **documented[str(status)]["content"]["application/json"]["schema"],
        "components": DOC["components"],
    }
    jsonschema.validate(response.json(), shape)
    if kind == "accepted":
        assert status == 400 and any(reason in response.text for reason in BEYOND_SCHEMA), (
            f"a body the document accepts was refused: {json.dumps(body)[:500]} → {response.text[:500]}"
        )
