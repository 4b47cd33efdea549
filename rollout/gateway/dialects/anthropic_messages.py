"""Anthropic Messages: `POST /v1/messages` (and `/v1/messages/count_tokens`), streaming with Anthropic's
events.

A request is first validated against `rollout.gateway.schemas.anthropic_messages` (what Anthropic publishes),
then mapped. Accepts what Claude Code sends: `?beta=true`, a system prompt as text blocks or as a `system`
entry inside `messages`, `thinking`, `context_management`, `output_config`, `metadata`, `cache_control` on any
block, and server tools (which have no `input_schema` and are skipped). Unknown fields are ignored. A request
whose messages hold nothing the model can read (only thinking blocks in user messages, say) is a 400.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from rollout.contracts import Message, SamplingParams, ToolCall, ToolSpec
from rollout.gateway.dialects.common import (
    answered_call,
    chunks,
    function_tool,
    get,
    new_id,
    obj,
    sse,
    text_of,
)
from rollout.gateway.requests import BadRequest, ChatRequest, Turn
from rollout.gateway.schemas.anthropic_messages import CountTokensRequest, MessagesRequest
from rollout.gateway.schemas.errors import AnthropicError, AnthropicErrorDetail
from rollout.gateway.schemas.validation import check

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _blocks(content: Any, field: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"'{field}' must be a string or an array of content blocks", field=field)
    return [obj(block, f"{field}[{i}]") for i, block in enumerate(content)]


def _messages(raw_messages: list[Any]) -> list[Message]:
    out: list[Message] = []
    made: set[str] = set()  # the ids of the tool_use blocks so far
    for index, raw in enumerate(raw_messages):
        field = f"messages[{index}]"
        item = obj(raw, field)
        role = item.get("role")
        blocks = _blocks(item.get("content", ""), f"{field}.content")
        if role == "system":
            out.append(Message.system(text_of(blocks, f"{field}.content")))
        elif role == "user":
            texts: list[str] = []
            for k, block in enumerate(blocks):
                kind = block.get("type")
                if kind == "tool_result":
                    result = block.get("content", "")
                    text = text_of(result, f"{field}.content[{k}].content") if result else ""
                    if block.get("is_error"):
                        text = f"Error: {text}"
                    call_id = block.get("tool_use_id")
                    if not isinstance(call_id, str):
                        raise BadRequest(
                            f"'{field}.content[{k}].tool_use_id' is required",
                            field=f"{field}.content[{k}].tool_use_id",
                        )
                    answered_call(call_id, made, f"{field}.content[{k}].tool_use_id")
                    out.append(Message.tool(call_id, text))
                elif kind == "text":
                    texts.append(str(block.get("text", "")))
                elif kind in ("image", "document"):
                    raise BadRequest(
                        f"'{field}.content[{k}]': {kind} blocks are not supported by this model",
                        field=f"{field}.content[{k}]",
                    )
            if texts:
                out.append(Message.user("".join(texts)))
        elif role == "assistant":
            text, reasoning, calls = "", None, []
            for block in blocks:
                kind = block.get("type")
                if kind == "text":
                    text += str(block.get("text", ""))
                elif kind == "thinking":
                    reasoning = str(block.get("thinking", ""))
                elif kind == "tool_use":
                    calls.append(
                        ToolCall(
                            id=str(block.get("id")),
                            name=str(block.get("name")),
                            arguments=json.dumps(block.get("input") or {}),
                        )
                    )
            made.update(call.id for call in calls)
            out.append(Message(role="assistant", text=text, reasoning=reasoning, tool_calls=tuple(calls)))
        else:
            raise BadRequest(f"'{field}.role' must be user or assistant", field=f"{field}.role")
    return out


def _tools(raw: list[Any]) -> tuple[ToolSpec, ...]:
    # Server tools (web search, ...) have no input_schema: Anthropic's platform runs them, not a model here.
    tools = [(i, obj(tool, f"tools[{i}]")) for i, tool in enumerate(raw)]
    return tuple(
        function_tool(t, f"tools[{i}]", schema_key="input_schema") for i, t in tools if "input_schema" in t
    )


class AnthropicMessages:
    name = "anthropic"

    def parse(self, body: Any, *, count_only: bool = False, max_context: int | None = None) -> ChatRequest:
        check(CountTokensRequest if count_only else MessagesRequest, body, max_context=max_context)
        body = obj(body, "body")
        raw_messages = get(body, "messages", list)
        # count_tokens takes no max_tokens (a client's stray one is ignored, whatever it holds)
        max_tokens = None if count_only else get(body, "max_tokens", int, None)
        system = body.get("system")
        messages = _messages(raw_messages)
        if system:
            messages.insert(0, Message.system(text_of(system, "system")))
        if not messages:  # e.g. only thinking blocks in user messages, which the model never sees
            raise BadRequest(
                "'messages' must hold at least one text, tool call or tool result the model can read",
                field="messages",
            )
        stops = get(body, "stop_sequences", list, [])
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=float(get(body, "temperature", (int, float), 1.0)),
            top_p=float(get(body, "top_p", (int, float), 1.0)),
            stop=tuple(str(s) for s in stops),
        )
        return ChatRequest(
            model=get(body, "model", str, "base"),
            messages=tuple(messages),
            tools=_tools(get(body, "tools", list, [])),
            params=params,
            stream=bool(get(body, "stream", bool, False)),
        )

    def _content(self, turn: Turn) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        if turn.reply.reasoning:
            content.append({"type": "thinking", "thinking": turn.reply.reasoning, "signature": "rollout"})
        if turn.reply.text or not turn.reply.tool_calls:
            content.append({"type": "text", "text": turn.reply.text})
        for call in turn.reply.tool_calls:
            content.append(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}
            )
        return content

    def stop_reason(self, turn: Turn) -> str:
        return "stop_sequence" if turn.stop_sequence else STOP_REASONS[turn.finish_reason]

    def usage(self, turn: Turn) -> dict[str, int]:
        # Anthropic counts input read from its cache apart from `input_tokens` (their sum is the prompt).
        return {
            "input_tokens": turn.prompt_tokens - turn.cached_tokens,
            "output_tokens": turn.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": turn.cached_tokens,
        }

    def response(self, turn: Turn) -> dict[str, Any]:
        return {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": turn.model,
            "content": self._content(turn),
            "stop_reason": self.stop_reason(turn),
            "stop_sequence": turn.stop_sequence,
            "usage": self.usage(turn),
        }

    def writer(self) -> MessagesStream:
        return MessagesStream(self)

    def error(self, status: int, message: str, field: str | None) -> dict[str, Any]:
        kinds = {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            410: "permission_error",
            405: "invalid_request_error",
            413: "request_too_large",
            429: "rate_limit_error",
            415: "invalid_request_error",
            421: "permission_error",
            503: "overloaded_error",
        }
        detail = AnthropicErrorDetail(type=kinds.get(status, "api_error"), message=message)
        return AnthropicError(error=detail).model_dump()


class MessagesStream:
    """Anthropic's events: `message_start`, `ping`, a thinking block, a text block and tool_use blocks (each
    opened when its first delta comes), `message_delta`, then `message_stop` (the terminating frame)."""

    def __init__(self, dialect: AnthropicMessages) -> None:
        self.dialect = dialect
        self.index = -1
        self.open: str | None = None  # the kind of the block open now
        self.text_block = False

    def start(self, model: str, prompt_tokens: int) -> list[bytes]:
        start = {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt_tokens,
                "output_tokens": 1,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [
            sse({"type": "message_start", "message": start}, "message_start"),
            sse({"type": "ping"}, "ping"),
        ]

    def _close(self) -> list[bytes]:
        frames: list[bytes] = []
        if self.open == "thinking":
            frames.append(self._delta({"type": "signature_delta", "signature": "rollout"}))
        if self.open is not None:
            frames.append(sse({"type": "content_block_stop", "index": self.index}, "content_block_stop"))
        self.open = None
        return frames

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        frames = self._close()
        self.index += 1
        self.open = block["type"]
        self.text_block = self.text_block or block["type"] == "text"
        frames.append(
            sse(
                {"type": "content_block_start", "index": self.index, "content_block": block},
                "content_block_start",
            )
        )
        return frames

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            {"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta"
        )

    def delta(self, kind: Literal["reasoning", "text"], text: str) -> list[bytes]:
        if kind == "reasoning":
            frames = (
                []
                if self.open == "thinking"
                else self._open({"type": "thinking", "thinking": "", "signature": ""})
            )
            return [*frames, self._delta({"type": "thinking_delta", "thinking": text})]
        frames = [] if self.open == "text" else self._open({"type": "text", "text": ""})
        return [*frames, self._delta({"type": "text_delta", "text": text})]

    def end(self, turn: Turn) -> tuple[list[bytes], list[bytes]]:
        frames: list[bytes] = []
        if not self.text_block and (turn.reply.text or not turn.reply.tool_calls):
            frames += self._open({"type": "text", "text": ""})  # a reply is never without content
        frames += self._close()
        for call in turn.reply.tool_calls:
            frames += self._open({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            frames += [
                self._delta({"type": "input_json_delta", "partial_json": piece})
                for piece in chunks(json.dumps(_input(call.arguments)))
            ]
            frames += self._close()
        frames.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": self.dialect.stop_reason(turn),
                        "stop_sequence": turn.stop_sequence,
                    },
                    # Cumulative, as Anthropic's are: now that the engine has said what its cache held.
                    "usage": self.dialect.usage(turn),
                },
                "message_delta",
            )
        )
        return frames, [sse({"type": "message_stop"}, "message_stop")]


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"value": value}
