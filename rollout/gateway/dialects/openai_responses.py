"""OpenAI Responses: `POST /v1/responses`, streaming as `response.*` events with sequence numbers.

A request is first validated against `rollout.gateway.schemas.openai_responses` (what OpenAI publishes), then
mapped. Accepts what Codex sends: `developer` messages, `instructions`, `reasoning`, `include`, `store:
false`, `prompt_cache_key`, `parallel_tool_calls`, function tools and custom tools; reasoning items in the
input attach to the assistant turn that follows them. Unknown fields, tool types and item types are ignored;
an unknown content part type is refused.
"""

from __future__ import annotations

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
    made: set[str] = set()  # the call ids of the function calls so far
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
            made.add(call.id)
            # Consecutive assistant output (a message, then calls) is one assistant turn.
            if out and out[-1].role == "assistant" and _continues_assistant_turn(raw[index - 1]):
                previous = out.pop()
                out.append(previous.model_copy(update={"tool_calls": (*previous.tool_calls, call)}))
            else:
                out.append(Message(role="assistant", text="", reasoning=reasoning, tool_calls=(call,)))
                reasoning = None
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output", "")
            call_id = answered_call(str(item.get("call_id")), made, f"{field}.call_id")
            out.append(Message.tool(call_id, text_of(output, f"{field}.output", TEXT_PARTS)))
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

    def output(
        self, turn: Turn, reasoning_id: str | None = None, message_id: str | None = None
    ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if turn.reply.reasoning:
            items.append(
                {
                    "type": "reasoning",
                    "id": reasoning_id or new_id("rs_"),
                    "summary": [{"type": "summary_text", "text": turn.reply.reasoning}],
                }
            )
        if turn.reply.text or not turn.reply.tool_calls:
            items.append(
                {
                    "type": "message",
                    "id": message_id or new_id("msg_"),
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

    def response_object(
        self, model: str, output: list[dict[str, Any]], response_id: str, turn: Turn | None = None
    ) -> dict[str, Any]:
        """The response: in progress without `turn`, completed (or incomplete, at the token limit) with it."""
        status = "in_progress" if turn is None else "completed"
        incomplete = turn is not None and turn.finish_reason == "length"
        return {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if incomplete else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": None,
            "max_output_tokens": None,
            "model": model,
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
            if turn is None
            else {
                "input_tokens": turn.prompt_tokens,
                "input_tokens_details": {"cached_tokens": turn.cached_tokens},
                "output_tokens": turn.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": turn.prompt_tokens + turn.completion_tokens,
            },
        }

    def response(self, turn: Turn) -> dict[str, Any]:
        return self.response_object(turn.model, self.output(turn), new_id("resp_"), turn)

    def writer(self) -> ResponsesStream:
        return ResponsesStream(self)

    def error(self, status: int, message: str, field: str | None) -> dict[str, Any]:
        return OpenAIChat().error(status, message, field)


class ResponsesStream:
    """`response.*` events with sequence numbers: created, in_progress, each output item (added, its deltas,
    done), then `response.completed` (the terminating frame). Text streams as `output_text` deltas; reasoning
    is one item, sent whole when the text begins or the turn ends (the item carries its summary when
    added)."""

    def __init__(self, dialect: OpenAIResponses) -> None:
        self.dialect = dialect
        self.response_id = new_id("resp_")
        self.reasoning_id, self.message_id = new_id("rs_"), new_id("msg_")
        self.model = ""
        self.sent = 0
        self.reasoning = ""  # held until the reasoning item is sent whole
        self.reasoning_sent = False
        self.message_open = False
        self.index = 0  # the next item's output index

    def _event(self, kind: str, **fields: Any) -> bytes:
        frame = sse({"type": kind, "sequence_number": self.sent, **fields}, kind)
        self.sent += 1
        return frame

    def start(self, model: str, prompt_tokens: int) -> list[bytes]:
        self.model = model
        progress = self.dialect.response_object(model, [], self.response_id)
        return [
            self._event("response.created", response=progress),
            self._event("response.in_progress", response=progress),
        ]

    def _item(self, item: dict[str, Any]) -> list[bytes]:
        """An item sent whole: added, then done."""
        frames = [
            self._event(
                "response.output_item.added", output_index=self.index, item={**item, "status": "in_progress"}
            ),
            self._event("response.output_item.done", output_index=self.index, item=item),
        ]
        self.index += 1
        return frames

    def _send_reasoning(self) -> list[bytes]:
        if self.reasoning_sent or not self.reasoning:
            return []
        self.reasoning_sent = True
        return self._item(
            {
                "type": "reasoning",
                "id": self.reasoning_id,
                "summary": [{"type": "summary_text", "text": self.reasoning}],
            }
        )

    def _open_message(self) -> list[bytes]:
        frames = self._send_reasoning()
        started = {"type": "message", "id": self.message_id, "status": "in_progress", "role": "assistant"}
        frames.append(
            self._event(
                "response.output_item.added", output_index=self.index, item={**started, "content": []}
            )
        )
        frames.append(
            self._event(
                "response.content_part.added",
                item_id=self.message_id,
                output_index=self.index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        )
        self.message_open = True
        return frames

    def delta(self, kind: Literal["reasoning", "text"], text: str) -> list[bytes]:
        if kind == "reasoning":
            self.reasoning += text
            return []
        frames = [] if self.message_open else self._open_message()
        frames.append(
            self._event(
                "response.output_text.delta",
                item_id=self.message_id,
                output_index=self.index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return frames

    def end(self, turn: Turn) -> tuple[list[bytes], list[bytes]]:
        output = self.dialect.output(turn, self.reasoning_id, self.message_id)
        frames = self._send_reasoning()
        for item in output:
            if item["type"] == "message":
                if not self.message_open:
                    frames += self._open_message()
                part = item["content"][0]
                where = {"item_id": item["id"], "output_index": self.index, "content_index": 0}
                frames.append(
                    self._event("response.output_text.done", **where, text=part["text"], logprobs=[])
                )
                frames.append(self._event("response.content_part.done", **where, part=part))
                frames.append(self._event("response.output_item.done", output_index=self.index, item=item))
                self.index += 1
            elif item["type"] == "function_call":
                frames.append(
                    self._event(
                        "response.output_item.added",
                        output_index=self.index,
                        item={**item, "status": "in_progress", "arguments": ""},
                    )
                )
                for piece in chunks(item["arguments"]):
                    frames.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=item["id"],
                            output_index=self.index,
                            delta=piece,
                        )
                    )
                frames.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=self.index,
                        arguments=item["arguments"],
                    )
                )
                frames.append(self._event("response.output_item.done", output_index=self.index, item=item))
                self.index += 1
        final = self.dialect.response_object(self.model, output, self.response_id, turn)
        return frames, [self._event("response.completed", response=final)]
