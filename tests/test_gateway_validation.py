"""A gateway that refuses bad input: what issue 13 found accepted is a 400 naming the field, in the dialect's
own shape (as the real SDKs read it); a body over the byte limit is a 413 before it is parsed; `/openapi.json`
describes exactly the routes served. A real model samples what is accepted."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from starlette.routing import Route

from rollout.engines.local import LocalEngine
from rollout.gateway.app import build_app
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Ledger
from rollout.rendering import ModelRenderer
from tests.gatewayutil import RunningGateway, serve_gateway

MAX_CONTEXT = 128
JSON = {"content-type": "application/json"}
LIMIT = 2048  # bytes
USER: Any = {"role": "user", "content": "hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}


@pytest.fixture(scope="module")
def engine(tiny_qwen3: str) -> LocalEngine:
    return LocalEngine(tiny_qwen3, device="cpu")


@pytest.fixture
async def running(ledger: Ledger, engine: LocalEngine) -> AsyncIterator[RunningGateway]:
    renderer = ModelRenderer(engine.tokenizer, "qwen3")
    async with serve_gateway(
        ledger, renderer, engine, max_context=MAX_CONTEXT, max_request_bytes=LIMIT
    ) as running:
        yield running


@pytest.fixture
async def http(running: RunningGateway, ledger: Ledger, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client on a fresh seat's base URL."""
    _, token = await open_seat(
        ledger, load_secret(tmp_path / "secret"), seat_id=f"valid-{uuid.uuid4().hex[:10]}", agent="a"
    )
    async with httpx.AsyncClient(base_url=f"{running.url}/s/{token}", timeout=60) as client:
        yield client


def openai_refusal(response: httpx.Response) -> tuple[str | None, str]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error["param"], error["message"]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"temperature": -3}, "temperature", "'temperature' must be at least 0"),
        ({"temperature": 2.5}, "temperature", "'temperature' must be at most 2"),
        ({"top_p": 1.5}, "top_p", "'top_p' must be at most 1"),
        ({"max_tokens": -1}, "max_tokens", "'max_tokens' must be at least 1"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "'max_completion_tokens' must be at least 1"),
        (
            {"max_tokens": 10**12},
            "max_tokens",
            f"'max_tokens' must be at most {MAX_CONTEXT}, the model's context length",
        ),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "'messages[0].content' is required"),
        (
            {"messages": [USER, {"role": "assistant"}, USER]},
            "messages[1].content",
            "'messages[1].content' is required unless the message carries tool_calls",
        ),
        (
            {"messages": [USER, {"role": "tool", "content": "x"}]},
            "messages[1].tool_call_id",
            "'messages[1].tool_call_id' is required",
        ),
        (
            {"messages": [{"role": "robot", "content": "x"}]},
            "messages[0].role",
            "'messages[0].role' must be one of system, developer, user, assistant, tool",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
            "'messages[0].content[0].text' is required",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "", "parameters": {}}}]},
            "tools[0].function.name",
            "'tools[0].function.name' must be a non-empty string",
        ),
        ({"n": 2}, "n", "'n' must be at most 1"),
        (
            {"messages": [USER, {"role": "tool", "tool_call_id": "never", "content": "x"}]},
            "messages[1].tool_call_id",
            "'messages[1].tool_call_id' answers tool call 'never', which no earlier assistant message made",
        ),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "'stop' must hold at most 4 items"),
        ({"stop": "x" * 257}, "stop", "'stop' must be at most 256 characters"),
        ({"stop": ["ok", ""]}, "stop[1]", "'stop[1]' must be a non-empty string"),
    ],
)
async def test_openai_chat_refuses_each_bad_field_by_name(
    http: httpx.AsyncClient, body: dict[str, Any], field: str, message: str
) -> None:
    response = await http.post("/v1/chat/completions", json={"model": "base", "messages": [USER], **body})
    assert openai_refusal(response) == (field, message)


async def test_an_assistant_message_may_omit_content_only_with_tool_calls(http: httpx.AsyncClient) -> None:
    history = [
        USER,
        {"role": "assistant", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    answered = await http.post("/v1/chat/completions", json={"messages": history, "max_tokens": 2})
    assert answered.status_code == 200, answered.text
    reply = answered.json()["choices"][0]["message"]
    # The reply itself, echoed back, is a valid message: without tool calls its content is a string.
    assert isinstance(reply["content"], str) or reply.get("tool_calls")
    again = await http.post(
        "/v1/chat/completions", json={"messages": [*history, reply, USER], "max_tokens": 2}
    )
    assert again.status_code == 200, again.text


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"max_output_tokens": -5}, "max_output_tokens", "'max_output_tokens' must be at least 1"),
        ({"temperature": 3}, "temperature", "'temperature' must be at most 2"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_video", "text": "x"}]}]},
            "input[0].content[0].type",
            "'input[0].content[0].type' must be one of input_text, output_text, text, refusal, input_image, "
            "input_file, input_audio",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
            "input[0].arguments",
            "'input[0].arguments' is required",
        ),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": "{}"}]},
            "tools[0].parameters",
            "'tools[0].parameters' must be an object",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "never", "output": "x"}]},
            "input[0].call_id",
            "'input[0].call_id' answers tool call 'never', which no earlier assistant message made",
        ),
    ],
)
async def test_openai_responses_refuses_each_bad_field_by_name(
    http: httpx.AsyncClient, body: dict[str, Any], field: str, message: str
) -> None:
    response = await http.post("/v1/responses", json={"model": "base", "input": "hi", **body})
    assert openai_refusal(response) == (field, message)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 0}, "'max_tokens' must be at least 1"),
        ({"max_tokens": 10**12}, f"'max_tokens' must be at most {MAX_CONTEXT}, the model's context length"),
        ({"temperature": 1.5}, "'temperature' must be at most 1"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "'messages[0].role' must be 'user', 'assistant' or 'system'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "video", "source": {}}]}]},
            "'messages[0].content[0].type' must be one of text, image, document, search_result, tool_use, "
            "tool_result, thinking, redacted_thinking, "
            + ", ".join(
                [
                    "server_tool_use",
                    "web_search_tool_result",
                    "web_fetch_tool_result",
                    "code_execution_tool_result",
                    "bash_code_execution_tool_result",
                    "text_editor_code_execution_tool_result",
                    "tool_search_tool_result",
                    "mcp_tool_use",
                    "mcp_tool_result",
                    "container_upload",
                ]
            ),
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "n", "input": "x"}],
                    }
                ]
            },
            "'messages[0].content[0].input' must be an object",
        ),
        ({"system": [{"type": "image"}]}, "'system[0].type' must be 'text'"),
        ({"tools": [{"name": "bash"}]}, "'tools[0].input_schema' is required"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "never"}]}]},
            "'messages[0].content[0].tool_use_id' answers tool call 'never', which no earlier assistant message "
            "made",
        ),
        ({"stop_sequences": [str(n) for n in range(17)]}, "'stop_sequences' must hold at most 16 items"),
        ({"stop_sequences": ["x" * 257]}, "'stop_sequences[0]' must be at most 256 characters"),
    ],
)
async def test_anthropic_messages_refuses_each_bad_field_by_name(
    http: httpx.AsyncClient, body: dict[str, Any], message: str
) -> None:
    response = await http.post(
        "/v1/messages", json={"model": "base", "max_tokens": 4, "messages": [USER], **body}
    )
    assert response.status_code == 400, response.text
    assert response.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


async def test_the_sdks_read_the_refusals(http: httpx.AsyncClient) -> None:
    base = str(http.base_url).rstrip("/")
    chat = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        await chat.chat.completions.create(model="base", messages=[USER], temperature=-3)
    assert refused.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as refused:
        await chat.responses.create(model="base", input="hi", max_output_tokens=-5)
    assert refused.value.param == "max_output_tokens"
    claude = anthropic.AsyncAnthropic(base_url=base, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as bad:
        await claude.messages.create(
            model="base", max_tokens=-1, messages=[{"role": "user", "content": "hi"}]
        )
    assert "'max_tokens' must be at least 1" in str(bad.value)


async def test_extreme_sampling_values_within_the_schema_are_answered(http: httpx.AsyncClient) -> None:
    # top_p 0 keeps only the top token; a vanishing temperature is greedy (no NaN from overflowing logits).
    for params in ({"top_p": 0}, {"temperature": 1e-300}, {"temperature": 0, "top_p": 1}):
        answered = await http.post(
            "/v1/chat/completions", json={"messages": [USER], "max_tokens": 3, "seed": -1, **params}
        )
        assert answered.status_code == 200, (params, answered.text)


async def test_a_body_over_the_limit_is_a_413_before_it_is_parsed(
    http: httpx.AsyncClient, running: RunningGateway
) -> None:
    over = b"{" + b" " * LIMIT  # not even JSON: a 413 says it was never parsed
    declared = await http.post("/v1/chat/completions", content=over, headers=JSON)
    assert declared.status_code == 413
    assert declared.json()["error"] == {
        "message": f"the request body is over the gateway's limit of {LIMIT} bytes",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_too_large",
    }

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused as it streams past the limit
        for _ in range(8):
            yield b" " * 512

    streamed = await http.post("/v1/messages", content=chunks(), headers=JSON)
    assert "content-length" not in streamed.request.headers
    assert streamed.status_code == 413
    assert streamed.json()["error"]["type"] == "request_too_large"

    under = json.dumps({"model": "base", "max_tokens": 2, "messages": [USER]}).encode()
    assert len(under) < LIMIT
    assert (await http.post("/v1/messages", content=under, headers=JSON)).status_code == 200
    # A body not declared JSON (a web page's form post) is refused before it is read, in the dialect's shape.
    as_text = await http.post("/v1/messages", content=under, headers={"content-type": "text/plain"})
    assert as_text.status_code == 415 and as_text.json()["type"] == "error", as_text.text
    assert "Content-Type: application/json" in as_text.json()["error"]["message"]

    async with httpx.AsyncClient(base_url=running.url) as anonymous:
        unknown = await anonymous.post("/v1/responses", headers={"x-api-key": "nope"}, content=over)
        assert unknown.status_code == 401, "a bad seat is answered before a bad body"
        rebound = await anonymous.post("/v1/responses", headers={"host": "evil.example"}, content=under)
        assert rebound.status_code == 421 and set(rebound.json()["error"]) == {
            "message",
            "type",
            "param",
            "code",
        }
        missing = await anonymous.get("/v1/nothing")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


async def test_the_openapi_document_lists_every_route_served(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url) as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    app = build_app(running.gateway, model_names=["base"])
    served = {
        (route.path, method.lower())
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
    }
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert documented == served - {(path, "head") for path, _ in served}
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"minimum": 1, "maximum": MAX_CONTEXT, "type": "integer"} in chat["max_tokens"]["anyOf"]
    assert (
        doc["components"]["schemas"]["MessagesRequest"]["properties"]["max_tokens"]["maximum"] == MAX_CONTEXT
    )
    errors = doc["paths"]["/v1/messages"]["post"]["responses"]
    assert errors["413"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AnthropicError"
    }


async def test_a_nul_character_in_any_string_is_a_400_not_a_failed_recording(http: httpx.AsyncClient) -> None:
    # Postgres cannot hold U+0000 in text or jsonb: the turn could be sampled but never recorded.
    tool = {"type": "function", "function": {"name": "sh\u0000ell", "parameters": {"type": "object"}}}
    for body in (
        {"messages": [USER], "max_tokens": 3, "tools": [tool]},
        {"messages": [{"role": "user", "content": "hi\u0000"}], "max_tokens": 3},
    ):
        answered = await http.post("/v1/chat/completions", json=body)
        assert answered.status_code == 400 and "NUL" in answered.json()["error"]["message"], answered.text
    escaped = await http.post(
        "/v1/chat/completions",
        content=b'{"messages": [{"role": "user", "content": "a literal \\\\u0000"}], "max_tokens": 3}',
        headers={"content-type": "application/json"},
    )
    assert escaped.status_code == 200, "a backslash followed by u0000 is text, not a NUL"
