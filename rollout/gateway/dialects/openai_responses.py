"""OpenAI Responses: `POST /v1/responses`, streaming as `response.*` events with sequence numbers.

A request is first validated against `rollout.gateway.schemas.openai_responses` (what OpenAI publishes), then
mapped. Accepts what Codex sends: `developer` messages, `instructions`, `reasoning`, `include`, `store: false`,
`prompt_cache_key`, `parallel_tool_calls`, function tools and custom tools; reasoning items in the input attach
to the assistant turn that follows them. Unknown fields, tool types and item types are ignored; an unknown
content part type is refused.
"""

from __future__ import annotations

import time
from typing import Any

from rollout.contracts import Message, SamplingParams, ToolCall, ToolSpec
from rollout.gateway.dialects.common import chunks, function_tool, get, new_id, obj, sse, text_of
from rollout.gateway.dialects.openai_chat import OpenAIChat
from rollout.gateway.requests import BadRequest, ChatRequest, Turn
from rollout.gateway.schemas.openai_responses import ResponsesRequest
from rollout.gateway.schemas.validation import check

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _items(raw: Any) -> list[Message]:
    if isinstance(raw, str):
        return [Message.user(raw)]
    if not isinstance(raw, list):
        raise BadRequest("'input' must be a string or an array of items", field="input")
    out: list[Message] = []
    reasoning: str | None = None
    for index, item in enumerate(raw):
        field = f"input[{index}]"
        item = obj(item, field)
        kind = item.get("type", "message")
        if kind == "message":
            role = item["role"]  # one of the schema's roles
            text = text_of(item.get("content"), f"{field}.content", TEXT_PARTS)
            if role == "assistant":
                out.append(Message(role="assistant", text=text, reasoning=reasoning))
                reasoning = None
            else:
                out.append(Message(role="system" if role == "developer" else role, text=text))
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments") if kind == "function_call" else item.get("input")
            call = ToolCall(
                id=str(item.get("call_id")), name=str(item.get("name")), arguments=str(arguments or "{}")
            )
            # Consecutive assistant output (a message, then calls) is one assistant turn.
            if out and out[-1].role == "assistant" and _continues_assistant_turn(raw[index - 1]):
                previous = out.pop()
                out.append(previous.model_copy(update={"tool_calls": (*previous.tool_calls, call)}))
            else:
                out.append(Message(role="assistant", text="", reasoning=reasoning, tool_calls=(call,)))
                reasoning = None
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output", "")
            out.append(Message.tool(str(item.get("call_id")), text_of(output, f"{field}.output", TEXT_PARTS)))
        elif kind == "reasoning":
            summary = item.get("summary") or item.get("content") or []
            reasoning = text_of(summary, f"{field}.summary", TEXT_PARTS) or None
    return out


def _continues_assistant_turn(previous: Any) -> bool:
    kind = previous.get("type", "message") if isinstance(previous, dict) else None
    return kind in ("function_call", "custom_tool_call") or (
        kind == "message" and previous.get("role") == "assistant"
    )


def _tools(raw: list[Any]) -> tuple[ToolSpec, ...]:
    # Only function tools are offered to the model; web_search, local_shell and grammar tools are not.
    tools = [(i, obj(tool, f"tools[{i}]")) for i, tool in enumerate(raw)]
    return tuple(function_tool(tool, f"tools[{i}]") for i, tool in tools if tool.get("type") == "function")


class OpenAIResponses:
    name = "openai-responses"

    def parse(self, body: Any, *, max_context: int | None = None) -> ChatRequest:
        check(ResponsesRequest, body, max_context=max_context)
        body = obj(body, "body")
        messages = _items(body["input"])
        instructions = get(body, "instructions", str, None)
        if instructions:
            messages.insert(0, Message.system(instructions))
        if not messages:
            raise BadRequest("'input' must hold at least one item", field="input")
        params = SamplingParams(
            max_tokens=get(body, "max_output_tokens", int, None),
            temperature=float(get(body, "temperature", (int, float), 1.0)),
            top_p=float(get(body, "top_p", (int, float), 1.0)),
        )
        return ChatRequest(
            model=get(body, "model", str, "base"),
            messages=tuple(messages),
            tools=_tools(get(body, "tools", list, [])),
            params=params,
            stream=bool(get(body, "stream", bool, False)),
        )

    def _output(self, turn: Turn) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if turn.reply.reasoning:
            items.append(
                {
                    "type": "reasoning",
                    "id": new_id("rs_"),
                    "summary": [{"type": "summary_text", "text": turn.reply.reasoning}],
                }
            )
        if turn.reply.text or not turn.reply.tool_calls:
            items.append(
                {
                    "type": "message",
                    "id": new_id("msg_"),
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": turn.reply.text, "annotations": []}],
                }
            )
        for call in turn.reply.tool_calls:
            items.append(
                {
                    "type": "function_call",
                    "id": new_id("fc_"),
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                    "status": "completed",
                }
            )
        return items

    def _response(
        self, turn: Turn, output: list[dict[str, Any]], status: str, response_id: str
    ) -> dict[str, Any]:
        incomplete = status == "completed" and turn.finish_reason == "length"
        return {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if incomplete else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": None,
            "max_output_tokens": None,
            "model": turn.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "user": None,
            "metadata": {},
            "usage": None
            if status != "completed"
            else {
                "input_tokens": turn.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": turn.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": turn.prompt_tokens + turn.completion_tokens,
            },
        }

    def response(self, turn: Turn) -> dict[str, Any]:
        return self._response(turn, self._output(turn), "completed", new_id("resp_"))

    def stream(self, turn: Turn) -> tuple[list[bytes], list[bytes]]:
        response_id = new_id("resp_")
        output = self._output(turn)
        frames: list[bytes] = []

        def emit(kind: str, **fields: Any) -> None:
            frames.append(sse({"type": kind, "sequence_number": len(frames), **fields}, kind))

        emit("response.created", response=self._response(turn, [], "in_progress", response_id))
        emit("response.in_progress", response=self._response(turn, [], "in_progress", response_id))
        for index, item in enumerate(output):
            started = {**item, "status": "in_progress"}
            if item["type"] == "message":
                started["content"] = []
            if item["type"] == "function_call":
                started["arguments"] = ""
            emit("response.output_item.added", output_index=index, item=started)
            if item["type"] == "message":
                part = item["content"][0]
                emit(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part={**part, "text": ""},
                )
                for piece in chunks(part["text"]):
                    emit(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                emit(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
                emit(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            elif item["type"] == "function_call":
                for piece in chunks(item["arguments"]):
                    emit(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=piece,
                    )
                emit(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            emit("response.output_item.done", output_index=index, item=item)
        final = self._response(turn, output, "completed", response_id)
        last = sse(
            {"type": "response.completed", "sequence_number": len(frames), "response": final},
            "response.completed",
        )
        return frames, [last]

    def error(self, status: int, message: str, field: str | None) -> dict[str, Any]:
        return OpenAIChat().error(status, message, field)
