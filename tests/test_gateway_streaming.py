"""Live streaming through the gateway, with the real OpenAI and Anthropic SDKs on a real port: the first token
reaches the client while the engine is still sampling, the recorded turn is what was streamed, and a client
that leaves mid-stream stops the engine and leaves one aborted turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from rollout.contracts import Message, ToolCall
from rollout.engines.scripted import ScriptedEngine
from rollout.gateway.live import _settled
from rollout.gateway.stops import StopScanner, cut_at_stop, partial_stop
from rollout.ledger import Kind, Ledger
from rollout.ledger.streams import seat_stream
from rollout.rendering import ModelRenderer
from tests.gatewayutil import RunningGateway, serve_gateway

THINK_S = 1.5  # the engine's sampling time per reply, spread over its tokens
LONG = "Streaming sends every token as soon as it is sampled, so the client reads while the model writes."
BASH: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


def script(prompt: str) -> Message:
    if "think first" in prompt:
        return Message(role="assistant", text="The answer is 4.", reasoning="Two plus two makes four.")
    if "<tools>" in prompt and "<tool_response>" not in prompt:
        call = ToolCall(id="call_1", name="bash", arguments='{"command": "ls"}')
        return Message.assistant("Let me look at the files.", tool_calls=(call,))
    return Message.assistant(LONG)


@pytest.fixture
async def running(ledger: Ledger, renderer: ModelRenderer) -> AsyncIterator[RunningGateway]:
    engine = ScriptedEngine(renderer, script, think_s=THINK_S)
    async with serve_gateway(ledger, renderer, engine, wait_s=1.0) as running:
        yield running


async def turns(ledger: Ledger, seat_id: str) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in await ledger.read(seat_stream(seat_id)) if e.kind == Kind.TURN_RECORDED]


def engine_of(running: RunningGateway) -> ScriptedEngine:
    assert isinstance(running.engine, ScriptedEngine)
    return running.engine


async def test_openai_chat_streams_before_the_engine_finishes_and_records_what_it_streamed(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger, renderer: ModelRenderer
) -> None:
    seat_id, token = seat
    engine = engine_of(running)
    client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "tell me about streaming"}], stream=True
    )
    pieces: list[str] = []
    finished_at_first: int | None = None
    first_at = 0.0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if finished_at_first is None:
                finished_at_first, first_at = engine.finished, time.perf_counter() - started
            pieces.append(chunk.choices[0].delta.content)
    total = time.perf_counter() - started
    assert finished_at_first == 0, "the first text arrived while the engine was still sampling"
    assert first_at < total / 2, (first_at, total)
    assert engine.finished == 1
    assert len(pieces) > 5, "the text came in many deltas, not one"
    text = "".join(pieces)
    assert text == LONG
    [record] = await turns(ledger, seat_id)
    expected_ids = engine.completion_ids(Message.assistant(LONG))
    assert record["completion_ids"] == expected_ids
    assert record["completion_logprobs"] == [0.0] * len(expected_ids)
    assert record["reply"]["text"] == text and not record.get("aborted")
    # Replayed, the recorded reply streams again, the same text.
    again = await client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "tell me about streaming"}], stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in again if c.choices]) == text
    assert engine.calls == 1 and len(await turns(ledger, seat_id)) == 1


async def test_anthropic_streams_thinking_then_text_before_the_engine_finishes(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    seat_id, token = seat
    engine = engine_of(running)
    client = anthropic.AsyncAnthropic(base_url=f"{running.url}/s/{token}", api_key="unused", max_retries=0)
    kinds: list[str] = []
    finished_at_first: int | None = None
    async with client.messages.stream(
        model="base", max_tokens=256, messages=[{"role": "user", "content": "think first: 2+2?"}]
    ) as stream:
        async for event in stream:
            if event.type == "content_block_delta":
                if finished_at_first is None:
                    finished_at_first = engine.finished
                kinds.append(event.delta.type)
        final = await stream.get_final_message()
    assert finished_at_first == 0, "the first delta arrived while the engine was still sampling"
    assert kinds[0] == "thinking_delta" and "text_delta" in kinds
    assert kinds.index("signature_delta") < kinds.index("text_delta"), "thinking ends before text begins"
    thinking = [b.thinking for b in final.content if b.type == "thinking"]
    text = [b.text for b in final.content if b.type == "text"]
    assert thinking == ["Two plus two makes four."] and text == ["The answer is 4."]
    assert final.stop_reason == "end_turn"
    [record] = await turns(ledger, seat_id)
    assert record["reply"]["text"] == text[0] and record["reply"]["reasoning"] == thinking[0]
    expected = engine.completion_ids(
        Message(role="assistant", text="The answer is 4.", reasoning="Two plus two makes four.")
    )
    assert record["completion_ids"] == expected


async def test_responses_stream_text_then_the_tool_call_parsed_from_the_whole_reply(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    seat_id, token = seat
    engine = engine_of(running)
    client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
    tools: Any = [{"type": "function", "name": "bash", "parameters": BASH["function"]["parameters"]}]
    deltas: list[str] = []
    finished_at_first: int | None = None
    async with client.responses.stream(model="base", input="list the files", tools=tools) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                if finished_at_first is None:
                    finished_at_first = engine.finished
                deltas.append(event.delta)
        final = await stream.get_final_response()
    assert finished_at_first == 0
    assert "".join(deltas) == "Let me look at the files." == final.output_text, "no tool-call markup leaks"
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "bash" and calls[0].arguments == '{"command": "ls"}'
    [record] = await turns(ledger, seat_id)
    assert record["finish_reason"] == "tool_calls" and record["reply"]["text"] == "Let me look at the files."


async def test_a_stop_string_cuts_the_stream_where_it_cuts_a_reply_and_stops_the_engine(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    seat_id, token = seat
    engine = engine_of(running)
    client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "tell me about streaming"}]
    stream = await client.chat.completions.create(
        model="base", messages=messages, stop=["sampled"], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert engine.cancelled == 1, "the engine stopped once the stop string was complete"
    [record] = await turns(ledger, seat_id)
    assert record["stop_sequence"] == "sampled" and record["reply"]["text"] == text
    assert text.startswith("Streaming sends every token as soon as it is") and "model writes" not in text
    whole = await client.chat.completions.create(
        model="base", messages=[*messages, {"role": "user", "content": "again"}], stop=["sampled"]
    )
    assert whole.choices[0].message.content == text, "streamed or not, a stop string cuts at the same place"


async def test_a_client_that_disconnects_mid_stream_stops_the_engine_and_leaves_one_aborted_turn(
    running: RunningGateway, seat: tuple[str, str], ledger: Ledger
) -> None:
    seat_id, token = seat
    engine = engine_of(running)
    client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "tell me about streaming"}], stream=True
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    await stream.close()  # the client goes away mid-reply
    for _ in range(200):
        if await turns(ledger, seat_id):
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # nothing more is recorded after the aborted turn
    records = await turns(ledger, seat_id)
    assert len(records) == 1 and records[0]["aborted"].startswith("stream aborted")
    assert engine.cancelled == 1 and engine.finished == 0, "the engine's generation was stopped"
    full = engine.completion_ids(Message.assistant(LONG))
    sampled = records[0]["completion_ids"]
    assert 0 < len(sampled) < len(full) and sampled == full[: len(sampled)]
    assert len(records[0]["completion_logprobs"]) == len(sampled)


def test_text_that_more_tokens_could_change_is_held_back() -> None:
    assert _settled("Hello world  ", ()) == "Hello world"  # the parse strips trailing whitespace
    assert _settled("Let me look. <tool_c", ()) == "Let me look."  # a tool-call tag being written
    assert _settled("reasoning </thi", ()) == "reasoning"
    assert _settled("if a < b then", ()) == "if a < b then"  # a `<` in prose is not a tag
    assert _settled("x<y>z", ()) == "x<y>z"
    assert _settled("caf\ufffd", ()) == "caf"  # a character still being decoded
    assert _settled("the end is ne", ("near",)) == "the end is"  # the start of a stop string
    assert _settled("plain text", ("STOP",)) == "plain text"
    assert _settled("x abab", ("ababc", "zz")) == "x"  # the longest start of any stop string


def test_stop_strings_are_found_scanning_only_what_is_new() -> None:
    scanner = StopScanner(("END", "stop here"))
    text = ""
    for piece in ["once ", "upon a time, sto", "p her", "e and END"]:
        text += piece
        if (hit := scanner.find(text)) is not None:
            break
    assert hit == "stop here" and text.endswith("e and END")  # found where it was completed, across pieces
    assert StopScanner(("ab",)).find("x\ufffd") is None
    assert partial_stop("well, sto", ("stop", "stoa")) == 3 and partial_stop("ok", ("stop",)) == 0
    words = [ord(c) for c in "go on STOP now"]
    assert cut_at_stop(lambda ids: "".join(map(chr, ids)), words, ("STOP", "now")) == (10, "STOP")
    assert cut_at_stop(lambda ids: "".join(map(chr, ids)), words, ("never",)) is None


def test_matching_a_long_stream_against_the_largest_stop_strings_costs_little_per_chunk() -> None:
    """16 stop strings of 256 characters against a 40,000-character reply fed 20 characters at a time: the
    scan of each chunk no longer grows with the reply (it took 25 ms per chunk for 10 stops of 10 kB)."""
    stops = tuple(f"{n:02d}" + "q" * 254 for n in range(16))
    scanner = StopScanner(stops)
    text = ""
    started = time.perf_counter()
    for _ in range(2000):
        text += "the quick brown fox "
        assert scanner.find(text) is None
        _settled(text, stops)
    assert (time.perf_counter() - started) / 2000 < 0.002


async def test_the_local_engine_streams_through_the_gateway_and_the_record_is_what_was_streamed(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str], tiny_qwen3: str
) -> None:
    from rollout.engines.local import LocalEngine

    seat_id, token = seat
    engine = LocalEngine(tiny_qwen3, device="cpu")
    async with serve_gateway(ledger, renderer, engine) as running:
        client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model="base",
            messages=[{"role": "user", "content": "say something"}],
            max_tokens=24,
            seed=3,
            stream=True,
        )
        reasoning, text, events = "", "", 0
        async for chunk in stream:
            if chunk.choices:
                delta: Any = chunk.choices[0].delta
                reasoning += getattr(delta, "reasoning_content", None) or ""
                text += delta.content or ""
                events += 1
    [record] = await turns(ledger, seat_id)
    assert len(record["completion_ids"]) == len(record["completion_logprobs"]) > 0
    assert all(x <= 0 for x in record["completion_logprobs"])
    assert record["reply"]["text"] == text and (record["reply"].get("reasoning") or "") == reasoning
    assert not [f for f in record["parse_failures"] if f.startswith("stream_divergence")]
    # The record's reply is the parse of its ids: nothing was streamed that the ids do not say.
    parsed = renderer.parse(record["completion_ids"], [], [])
    assert (parsed.message.text, parsed.message.reasoning or "") == (text, reasoning)
    assert events > 2
