"""OpenAI Chat Completions: `POST /v1/chat/completions`, streaming as `chat.completion.chunk` events.

A request is first validated against `rollout.gateway.schemas.openai_chat` (what OpenAI publishes), then
mapped. An assistant reply without tool calls always has string `content`, so a client that echoes it back
sends a valid message.
"""

from __future__ import annotations

import json
import time
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
from rollout.gateway.schemas.errors import OpenAIError, OpenAIErrorDetail
from rollout.gateway.schemas.openai_chat import ChatCompletionRequest
from rollout.gateway.schemas.validation import check


def _message(raw: Any, index: int) -> Message:
    field = f"messages[{index}]"
    item = obj(raw, field)
    role = item["role"]  # one of the schema's roles
    text = text_of(item.get("content"), f"{field}.content")
    if role == "developer":
        role = "system"
    calls: list[ToolCall] = []
    for k, call in enumerate(get(item, "tool_calls", list, [], prefix=f"{field}.")):
        call = obj(call, f"{field}.tool_calls[{k}]")
        function = obj(call.get("function"), f"{field}.tool_calls[{k}].function")
        calls.append(
            ToolCall(
                id=str(call.get("id") or new_id("call_")),
                name=str(function.get("name", "")),
                arguments=str(function.get("arguments") or "{}"),
            )
        )
    reasoning = item.get("reasoning_content") or item.get("reasoning")
    if role == "tool":
        call_id = get(item, "tool_call_id", str, None, prefix=f"{field}.")
        if not call_id:
            raise BadRequest(
                f"'{field}.tool_call_id' is required for tool messages", field=f"{field}.tool_call_id"
            )
        return Message(role="tool", text=text, tool_call_id=call_id)
    return Message(
        role=role,
        text=text,
        tool_calls=tuple(calls),
        reasoning=reasoning if isinstance(reasoning, str) else None,
    )


def _messages(raw_messages: list[Any]) -> tuple[Message, ...]:
    messages = tuple(_message(m, i) for i, m in enumerate(raw_messages))
    made: set[str] = set()  # the ids of the assistant's tool calls so far
    for index, message in enumerate(messages):
        made.update(call.id for call in message.tool_calls)
        if message.role == "tool" and message.tool_call_id is not None:
            answered_call(message.tool_call_id, made, f"messages[{index}].tool_call_id")
    return messages


def _tools(raw: list[Any]) -> tuple[ToolSpec, ...]:
    return tuple(
        function_tool(
            obj(obj(tool, f"tools[{i}]").get("function"), f"tools[{i}].function"), f"tools[{i}].function"
        )
        for i, tool in enumerate(raw)
    )


class OpenAIChat:
    name = "openai-chat"

    def parse(self, body: Any, *, max_context: int | None = None) -> ChatRequest:
        check(ChatCompletionRequest, body, max_context=max_context)
        body = obj(body, "body")
        raw_messages = get(body, "messages", list)
        stop = get(body, "stop", (str, list), None)
        params = SamplingParams(
            max_tokens=get(body, "max_completion_tokens", int, None) or get(body, "max_tokens", int, None),
            temperature=float(get(body, "temperature", (int, float), 1.0)),
            top_p=float(get(body, "top_p", (int, float), 1.0)),
            stop=(stop,) if isinstance(stop, str) else tuple(str(s) for s in stop or ()),
            seed=get(body, "seed", int, None),
        )
        return ChatRequest(
            model=get(body, "model", str, "base"),
            messages=_messages(raw_messages),
            tools=_tools(get(body, "tools", list, [])),
            params=params,
            stream=bool(get(body, "stream", bool, False)),
        )

    def _message_json(self, turn: Turn) -> dict[str, Any]:
        text = turn.reply.text or (None if turn.reply.tool_calls else "")
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if turn.reply.reasoning:
            message["reasoning_content"] = turn.reply.reasoning
        if turn.reply.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in turn.reply.tool_calls
            ]
        return message

    def usage(self, turn: Turn) -> dict[str, Any]:
        return {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.completion_tokens,
            "total_tokens": turn.prompt_tokens + turn.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": turn.cached_tokens},
        }

    def response(self, turn: Turn) -> dict[str, Any]:
        return {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": turn.model,
            "choices": [
                {
                    "index": 0,
                    "message": self._message_json(turn),
                    "finish_reason": turn.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": self.usage(turn),
        }

    def writer(self) -> ChatStream:
        return ChatStream(self)

    def error(self, status: int, message: str, field: str | None) -> dict[str, Any]:
        kinds = {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            410: "invalid_request_error",
            405: "invalid_request_error",
            413: "invalid_request_error",
            429: "rate_limit_error",
            415: "invalid_request_error",
            421: "invalid_request_error",
            503: "service_unavailable",
        }
        detail = OpenAIErrorDetail(
            message=message,
            type=kinds.get(status, "api_error"),
            param=field,
            code={
                401: "invalid_api_key",
                410: "seat_finished",
                413: "request_too_large",
                429: "rate_limit_exceeded",
            }.get(status),
        )
        return OpenAIError(error=detail).model_dump()


class ChatStream:
    """`chat.completion.chunk` frames: the role, reasoning and content deltas, tool calls, the finish reason,
    then usage and `[DONE]` (the terminating frames)."""

    def __init__(self, dialect: OpenAIChat) -> None:
        self.dialect = dialect
        self.base: dict[str, Any] = {}

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(
            {
                **self.base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }
        )

    def start(self, model: str, prompt_tokens: int) -> list[bytes]:
        self.base = {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        return [self._chunk({"role": "assistant", "content": ""})]

    def delta(self, kind: Literal["reasoning", "text"], text: str) -> list[bytes]:
        return [self._chunk({"reasoning_content" if kind == "reasoning" else "content": text})]

    def end(self, turn: Turn) -> tuple[list[bytes], list[bytes]]:
        frames: list[bytes] = []
        for index, call in enumerate(turn.reply.tool_calls):
            frames.append(
                self._chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for piece in chunks(call.arguments):
                frames.append(
                    self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                )
        frames.append(self._chunk({}, turn.finish_reason))
        usage = sse({**self.base, "choices": [], "usage": self.dialect.usage(turn)})
        return frames, [usage, sse("[DONE]")]


def arguments_json(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
