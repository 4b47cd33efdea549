"""The gateway against the real OpenAI and Anthropic SDKs: three dialects, streaming and not, tool loops, and
what the ledger recorded for them."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from rollout.engines.scripted import ScriptedEngine
from rollout.gateway.seats import close_seat
from rollout.ledger import Ledger
from rollout.rendering import ModelRenderer
from tests.gatewayutil import BASH, RunningGateway, serve_gateway, tool_loop_script, turns


@pytest.fixture
async def running(ledger: Ledger, renderer: ModelRenderer) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(
        ledger, renderer, ScriptedEngine(renderer, tool_loop_script), wait_s=1.0
    ) as running:
        yield running


def chained(records: list[dict[str, Any]]) -> list[int]:
    """The segment's ids rebuilt from its records: each prompt extends the ids before it."""
    ids: list[int] = []
    for record in records:
        ids = ids[: record["prompt_prefix_len"]] + record["prompt_ids_delta"] + record["completion_ids"]
    return ids


async def test_openai_chat_tool_loop_records_one_token_exact_segment(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger, renderer: ModelRenderer
) -> None:
    seat_id, token = seat
    client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "list the files"}]
    first = await client.chat.completions.create(model="base", messages=messages, tools=[BASH])
    tool_calls = first.choices[0].message.tool_calls
    assert tool_calls is not None
    call = tool_calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "README.md\nsrc"},
    ]
    second = await client.chat.completions.create(model="base", messages=messages, tools=[BASH])
    assert second.choices[0].message.content == "I ran 1 command(s). Done."
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens

    records = await turns(ledger, seat_id)
    assert [r["turn_index"] for r in records] == [0, 1]
    assert records[0]["segment_id"] == records[1]["segment_id"], "the second turn extends the first"
    first_ids = records[0]["prompt_ids_delta"] + records[0]["completion_ids"]
    assert records[1]["prompt_prefix_len"] == len(first_ids)  # nothing sampled was re-tokenised
    assert all(len(r["completion_ids"]) == len(r["completion_logprobs"]) for r in records)
    assert records[0]["checkpoint"] == "base" and records[0]["engine"] == "scripted"
    # The segment is exactly what the engine saw: the second prompt is the first turn's ids plus the new ones.
    assert chained(records)[: len(first_ids)] == first_ids


async def test_openai_chat_streaming(running: RunningGateway, seat: tuple[str, str], ledger: Ledger) -> None:
    seat_id, token = seat
    client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key=token, max_retries=0)
    stream = await client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text, finish = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert (text, finish) == ("Hello from the script.", "stop")
    assert len(await turns(ledger, seat_id)) == 1


async def test_openai_responses_tool_loop_streaming_and_not(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    seat_id, token = seat
    client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
    tools: Any = [
        {
            "type": "function",
            "name": "bash",
            "description": "Run a shell command",
            "parameters": BASH["function"]["parameters"],
        }
    ]
    items: list[Any] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "list the files"},
    ]
    first = await client.responses.create(
        model="base",
        input=items,
        tools=tools,
        store=False,
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "bash"
    items += [
        calls[0].model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "README.md"},
    ]
    async with client.responses.stream(model="base", input=items, tools=tools) as stream:
        final = await stream.get_final_response()
    assert final.output_text == "I ran 1 command(s). Done."
    records = await turns(ledger, seat_id)
    assert len({r["segment_id"] for r in records}) == 1


async def test_anthropic_messages_tool_loop_streaming_and_count_tokens(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    seat_id, token = seat
    client = anthropic.AsyncAnthropic(base_url=f"{running.url}/s/{token}", api_key="unused", max_retries=0)
    tools: Any = [
        {
            "name": "bash",
            "description": "Run a shell command",
            "input_schema": BASH["function"]["parameters"],
        },
        {"type": "web_search_20250305", "name": "web_search"},
    ]
    messages: list[Any] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "list the files", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    first = await client.messages.create(
        model="base",
        max_tokens=256,
        system=[{"type": "text", "text": "You code."}],
        messages=messages,
        tools=tools,
        metadata={"user_id": "u"},
        extra_body={"context_management": {}, "output_config": {}},
        extra_query={"beta": "true"},
    )
    assert first.stop_reason == "tool_use"
    use = next(block for block in first.content if block.type == "tool_use")
    assert use.name == "bash" and use.input == {"command": "ls"}
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "README.md"}]},
    ]
    async with client.messages.stream(
        model="base", max_tokens=256, system="You code.", messages=messages, tools=tools
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "end_turn"
    assert [b.text for b in final.content if b.type == "text"] == ["I ran 1 command(s). Done."]
    counted = await client.messages.count_tokens(
        model="base", messages=messages, tools=tools, system="You code."
    )
    assert counted.input_tokens > 10
    records = await turns(ledger, seat_id)
    assert len(records) == 2 and records[0]["segment_id"] == records[1]["segment_id"]


async def test_a_retried_request_replays_the_recorded_turn(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    seat_id, token = seat
    client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
    request: Any = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7}
    assert isinstance(running.engine, ScriptedEngine)
    calls_before = running.engine.calls
    first = await client.chat.completions.create(**request)
    again = await client.chat.completions.create(**request)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert running.engine.calls == calls_before + 1, (
        "the retry is answered from the record, not sampled again"
    )
    assert len(await turns(ledger, seat_id)) == 1


async def test_seat_errors_come_in_each_dialects_shape(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    seat_id, token = seat
    async with httpx.AsyncClient(base_url=running.url) as http:
        unknown = await http.post(
            "/v1/chat/completions",
            headers={"authorization": "Bearer nope"},
            json={"messages": [{"role": "user", "content": "x"}]},
        )
        assert unknown.status_code == 401 and unknown.json()["error"]["type"] == "authentication_error"
        missing = await http.post("/v1/messages", json={"messages": [], "max_tokens": 5})
        assert missing.status_code == 401 and missing.json()["type"] == "error"
        bad = await http.post(
            f"/s/{token}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
        assert bad.json()["error"]["message"] == "'temperature' must be a number"
        no_max = await http.post(
            f"/s/{token}/v1/messages", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert no_max.status_code == 400 and no_max.json()["error"]["message"] == "'max_tokens' is required"
        not_json = await http.post(
            f"/s/{token}/v1/responses", content=b"{oops", headers={"content-type": "application/json"}
        )
        assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
        await close_seat(ledger, seat_id)
        gone = await http.post(
            f"/s/{token}/v1/messages", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
        )
        assert gone.status_code == 410 and gone.json()["error"]["type"] == "permission_error"


async def test_a_prompt_over_the_context_is_a_400(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str]
) -> None:
    _, token = seat
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, max_context=16) as small,
        httpx.AsyncClient(base_url=small.url) as http,
    ):
        response = await http.post(
            f"/s/{token}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "a long question " * 10}]},
        )
    assert response.status_code == 400 and "context is 16" in response.json()["error"]["message"]


async def test_a_turn_rendered_ahead_still_answers_to_its_seat(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str]
) -> None:
    """A seat served before has its next turn rendered while the seat is looked up: a repeated request still
    gets its recorded reply, a prompt over the context still 400, and a seat closed since still 410."""
    seat_id, token = seat
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, max_context=64) as small,
        httpx.AsyncClient(base_url=small.url) as http,
    ):
        url = f"/s/{token}/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        first = await http.post(url, json=body)
        again = await http.post(url, json=body)
        assert first.status_code == again.status_code == 200
        assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
        assert len(await turns(ledger, seat_id)) == 1, "the repeat is a replay, not a second sample"
        long = await http.post(url, json={"messages": [{"role": "user", "content": "a long question " * 20}]})
        assert long.status_code == 400 and "context is 64" in long.json()["error"]["message"]
        await close_seat(ledger, seat_id)
        gone = await http.post(url, json={"messages": [{"role": "user", "content": "later"}]})
        assert gone.status_code == 410
    assert len(await turns(ledger, seat_id)) == 1


async def test_an_engine_that_is_down_gives_503_then_recovers(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str], tiny_qwen3: str
) -> None:
    import uvicorn

    from rollout.engines.local import LocalEngine
    from rollout.engines.vllm_client import VLLMEngine
    from rollout.engines.vllm_server import build_app
    from rollout.net import free_port
    from rollout.serving.keys import engine_api_key

    _, token = seat
    port = free_port()
    api_key = engine_api_key(secrets.token_bytes(32))  # the engine's key: the gateway reaches it with it
    engine = VLLMEngine(f"http://127.0.0.1:{port}", api_key=api_key)  # nothing listens there yet
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    async with (
        serve_gateway(ledger, renderer, engine, wait_s=0.2) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        refused = await http.post(f"/s/{token}/v1/messages", json=body)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "overloaded_error"
        # The engine comes up on its address: the next turn goes through, nothing restarted.
        local = LocalEngine(tiny_qwen3, device="cpu")
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(local, api_key=api_key), host="127.0.0.1", port=port, log_level="warning"
            )
        )
        serving = asyncio.create_task(server.serve())
        try:
            for _ in range(500):
                if server.started:
                    break
                await asyncio.sleep(0.02)
            recovered = await http.post(f"/s/{token}/v1/messages", json=body)
            assert recovered.status_code == 200, recovered.text
        finally:
            server.should_exit = True
            await serving
    await engine.close()


def test_a_malformed_tool_call_comes_back_as_text_with_the_failure_recorded(renderer: ModelRenderer) -> None:
    ids = renderer.tokenizer.encode(
        '<tool_call>\n{"name": "bash", "arguments": {oops}\n</tool_call><|im_end|>'
    )
    parsed = renderer.parse(ids, [], [])
    assert parsed.message.tool_calls == ()
    assert "{oops}" in parsed.message.text
    assert parsed.parse_failures and parsed.parse_failures[0].startswith("invalid_json")


async def test_a_client_that_leaves_mid_stream_gets_its_turn_recorded_as_aborted(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    from rollout.gateway.app import SSEResponse
    from rollout.gateway.dialects.openai_chat import OpenAIChat
    from rollout.gateway.sampled import Sampled
    from rollout.gateway.seats import resolve

    seat_id, token = seat
    resolved = await resolve(ledger, token)
    assert resolved is not None
    dialect = OpenAIChat()
    request = dialect.parse({"messages": [{"role": "user", "content": "hi"}], "stream": True})
    sampled = await running.gateway.sample(resolved, request)
    assert isinstance(sampled, Sampled)
    writer = dialect.writer()
    sent: list[bytes] = []

    async def receive() -> Any:
        return {"type": "http.disconnect"}  # the client is already gone

    async def send(message: Any) -> None:
        sent.append(message.get("body", b""))

    await SSEResponse(running.gateway, sampled, writer)({"type": "http"}, receive, send)
    assert b"[DONE]" not in b"".join(sent), "a departed client gets no terminating frame"
    records = await turns(ledger, seat_id)
    assert len(records) == 1 and records[0]["aborted"].startswith("stream aborted")
    # Aborted turns are never replayed: the same request samples afresh and is recorded normally.
    again = await running.gateway.complete(resolved, request)
    assert not again.replayed
    assert [bool(r.get("aborted")) for r in await turns(ledger, seat_id)] == [True, False]
