"""The gateway against the real OpenAI and Anthropic SDKs: three dialects, streaming and not, tool loops, and
what the ledger recorded for them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from transformers import AutoTokenizer

from rollout.activities.agent_loop import GatewayChat, SeatClosed, play
from rollout.contracts import Message
from rollout.engines.protocol import SampleRequest, SampleResult
from rollout.engines.scripted import ScriptedEngine
from rollout.gateway.seats import close_seat, load_secret, open_seat
from rollout.harness import End, Observation, RunContext, Task
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import run_stream, seat_stream
from rollout.rendering import ModelRenderer
from tests.gatewayutil import RunningGateway, serve_gateway, tool_loop_script

BASH: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


@pytest.fixture(scope="module")
def renderer(tiny_qwen3: str) -> ModelRenderer:
    return ModelRenderer(AutoTokenizer.from_pretrained(tiny_qwen3), "qwen3")


@pytest.fixture
async def running(ledger: Ledger, renderer: ModelRenderer) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(
        ledger, renderer, ScriptedEngine(renderer, tool_loop_script), wait_s=1.0
    ) as running:
        yield running


@pytest.fixture
async def seat(ledger: Ledger, tmp_path: Any) -> tuple[str, str]:
    seat_id = f"test-{uuid.uuid4().hex[:10]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent="solver")
    return seat_id, token


async def turns(ledger: Ledger, seat_id: str) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in await ledger.read(seat_stream(seat_id)) if e.kind == Kind.TURN_RECORDED]


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
        not_json = await http.post(f"/s/{token}/v1/responses", content=b"{oops")
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


async def test_a_paused_run_holds_turns_then_answers_503_with_retry_after(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    await ledger.append_one(
        run_stream(run),
        NewEvent("created", Kind.RUN_CREATED, {"run": run, "environment": "e", "settings": {"paused": True}}),
    )
    _, token = await open_seat(ledger, load_secret(tmp_path / "s"), seat_id=f"{run}/a", agent="a", run=run)
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, wait_s=0.5) as paused,
        httpx.AsyncClient(base_url=paused.url) as http,
    ):
        held = await http.post(
            f"/s/{token}/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        )
        assert held.status_code == 503 and held.headers["retry-after"] == "1"
        assert "paused" in held.json()["error"]["message"]
        await ledger.append_one(
            run_stream(run),
            NewEvent("resume", Kind.SETTINGS_CHANGED, {"run": run, "changes": {"paused": False}}),
        )
        resumed = await http.post(
            f"/s/{token}/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        )
        assert resumed.status_code == 200


class _SaysAnything(Task):
    async def start(self, run: RunContext) -> Observation:
        return Observation("say anything")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=1.0)


async def test_a_turn_held_while_its_run_is_paused_is_refused_for_good_once_the_run_stops(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    """A run stopped while paused would otherwise hold its last episodes' turns until a resume never sent."""
    run = f"run-{uuid.uuid4().hex[:8]}"
    await ledger.append_one(
        run_stream(run),
        NewEvent("created", Kind.RUN_CREATED, {"run": run, "environment": "e", "settings": {"paused": True}}),
    )
    _, token = await open_seat(ledger, load_secret(tmp_path / "s"), seat_id=f"{run}/a", agent="a", run=run)
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, wait_s=60) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=90) as http,
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        held = asyncio.create_task(http.post(f"/s/{token}/v1/chat/completions", json=body))
        await asyncio.sleep(0.3)
        assert not held.done(), "the paused run holds the turn"
        started = time.monotonic()
        await ledger.append_one(
            run_stream(run),
            NewEvent("stop", Kind.SETTINGS_CHANGED, {"run": run, "changes": {"stopped": True}}),
        )
        refused = await held
        assert time.monotonic() - started < 10, "refused when the run stopped, not when the wait ran out"
        assert refused.status_code == 410, refused.text
        assert "was stopped" in refused.json()["error"]["message"]
        # The episode's loop takes that as the end of its seat: a failure no retry would change.
        model = GatewayChat(f"{gateway.url}/s/{token}/v1", token, outage_window_s=5)
        context = RunContext(run=run, episode="e", seat=f"{run}/a", attempt=1, parameters={})
        with pytest.raises(SeatClosed) as closed:
            await play(_SaysAnything(), context, model, max_turns=2)
        await model.close()
        assert closed.value.failure.kind == "SeatClosed" and closed.value.failure.deterministic
        assert f"run {run} was stopped" in closed.value.failure.reason


async def test_an_engine_that_is_down_gives_503_then_recovers(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str], tiny_qwen3: str
) -> None:
    import uvicorn

    from rollout.engines.local import LocalEngine
    from rollout.engines.vllm_client import VLLMEngine
    from rollout.engines.vllm_server import build_app
    from rollout.net import free_port

    _, token = seat
    port = free_port()
    engine = VLLMEngine(f"http://127.0.0.1:{port}")  # nothing listens there yet
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
            uvicorn.Config(build_app(local), host="127.0.0.1", port=port, log_level="warning")
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


class BudgetsSeen(ScriptedEngine):
    """A scripted engine that keeps the token budget each turn was sampled with."""

    def __init__(self, renderer: ModelRenderer, **kwargs: Any) -> None:
        super().__init__(renderer, tool_loop_script, **kwargs)
        self.budgets: list[int] = []

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.budgets.append(request.max_tokens)
        return await super().sample(request)


async def test_a_turn_that_names_no_budget_gets_the_default_one(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str]
) -> None:
    """Without the default an agent leaving `max_tokens` out would sample to the end of the context."""
    _, token = seat
    engine = BudgetsSeen(renderer)
    async with (
        serve_gateway(ledger, renderer, engine, max_context=4096, default_max_tokens=100) as running,
        httpx.AsyncClient(base_url=f"{running.url}/s/{token}/v1") as http,
    ):
        for n, budget in enumerate([None, 3000, 50]):
            body: dict[str, Any] = {"messages": [{"role": "user", "content": f"question {n}"}]}
            if budget is not None:
                body["max_tokens"] = budget
            assert (await http.post("/chat/completions", json=body)).status_code == 200
        answered = await http.post("/responses", json={"input": "question 3"})
        assert answered.status_code == 200
    # none named: the default; one named is kept, above the default too (the room left in the context caps it)
    assert engine.budgets[0] == 100 and engine.budgets[2] == 50 and engine.budgets[3] == 100
    assert 100 < engine.budgets[1] <= 3000


async def test_a_thousand_stop_strings_are_a_400_naming_the_field(
    running: RunningGateway, seat: tuple[str, str]
) -> None:
    """Each stop string is matched against every reply: their number and length are capped."""
    _, token = seat
    stops = [f"stop {n}" for n in range(1000)]
    user = [{"role": "user", "content": "hi"}]
    async with httpx.AsyncClient(base_url=f"{running.url}/s/{token}/v1") as http:
        chat = await http.post("/chat/completions", json={"messages": user, "stop": stops})
        anthropic_ = await http.post(
            "/messages", json={"messages": user, "max_tokens": 8, "stop_sequences": stops}
        )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "stop"
    assert anthropic_.status_code == 400
    assert anthropic_.json()["error"]["message"] == "'stop_sequences' must hold at most 16 items"


async def test_a_seat_flooding_the_gateway_gets_429s_while_other_seats_are_answered(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    """50 turns at once from one seat: its limit's worth are sampled and the rest get 429 with Retry-After;
    a replay of its recorded turn is still answered, and another seat's turns take about as long as idle."""
    secret = load_secret(tmp_path / "secret")
    _, flooder = await open_seat(ledger, secret, seat_id=f"flood-{uuid.uuid4().hex[:8]}", agent="a")
    _, other = await open_seat(ledger, secret, seat_id=f"other-{uuid.uuid4().hex[:8]}", agent="a")
    engine = ScriptedEngine(renderer, tool_loop_script, think_s=1.0)
    async with (
        serve_gateway(ledger, renderer, engine, max_turns_in_flight_per_seat=4) as running,
        httpx.AsyncClient(base_url=running.url, timeout=30) as http,
    ):

        async def ask(token: str, text: str) -> httpx.Response:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 16}
            return await http.post(f"/s/{token}/v1/chat/completions", json=body)

        async def timed(token: str, text: str) -> float:
            started = time.perf_counter()
            assert (await ask(token, text)).status_code == 200
            return time.perf_counter() - started

        assert (await ask(flooder, "recorded")).status_code == 200
        idle = sorted(await asyncio.gather(*[timed(other, f"idle {n}") for n in range(3)]))[1]
        flood = [asyncio.create_task(ask(flooder, f"flood {n}")) for n in range(50)]
        await asyncio.sleep(0.3)  # the flood is in: its first four are being sampled
        replay = await ask(flooder, "recorded")
        loaded = sorted(await asyncio.gather(*[timed(other, f"loaded {n}") for n in range(3)]))[1]
        answers = await asyncio.gather(*flood)
    assert replay.status_code == 200, "a replay is answered whatever the seat has in flight"
    assert sorted(a.status_code for a in answers) == [200] * 4 + [429] * 46
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert loaded < 2 * idle, f"another seat's p50 went from {idle:.2f} s idle to {loaded:.2f} s"


async def test_per_seat_state_is_bounded_and_dropped_when_the_seat_closes(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    secret = load_secret(tmp_path / "secret")
    seats = [
        await open_seat(ledger, secret, seat_id=f"lru{n}-{uuid.uuid4().hex[:8]}", agent="a") for n in range(3)
    ]
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, max_seats_kept=2) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        first = [{"role": "user", "content": "list the files"}]

        async def ask(token: str, messages: list[dict[str, Any]]) -> httpx.Response:
            body = {"messages": messages, "tools": [BASH]}
            return await http.post(f"/s/{token}/v1/chat/completions", json=body)

        replies = [(await ask(token, first)).json()["choices"][0]["message"] for _, token in seats]
        kept = running.gateway.seats
        assert len(kept) == 2 and seats[0][0].seat_id not in kept, "the least recently used seat is let go"
        # A seat let go has its segment rebuilt from its stream: its next turn still extends it.
        (seat, token), call = seats[0], replies[0]
        result = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "README.md"}
        assert (await ask(token, [*first, call, result])).status_code == 200
        records = await turns(ledger, seat.seat_id)
        assert records[1]["segment_id"] == records[0]["segment_id"] and records[1]["prompt_prefix_len"] > 0
        await close_seat(ledger, seats[1][0].seat_id)
        assert (await ask(seats[1][1], first)).status_code == 410
        assert seats[1][0].seat_id not in kept, "a closed seat's state is dropped"
