"""Messages ↔ token ids for one model, through a `renderers` renderer.

Contract:
- `prompt_ids` renders canonical messages and tools exactly as the model's chat template does, ending at the
  generation prompt.
- `bridge` extends a previous turn's exact prompt and sampled ids with new messages without re-tokenising
  anything sampled, or returns None when the renderer cannot prove that is safe (then the caller re-renders
  and starts a new segment).
- `parse` turns sampled ids into a canonical assistant message; it never raises: tool calls that do not parse
  are kept as text, and their failures are reported for the record.
- `parse_prefix` parses a reply still being sampled: its reasoning (and whether that is still open), its text
  so far and whether a tool call has begun (a tool call being written is not folded into the text).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from renderers import (
    AutoRendererConfig,
    CustomRendererConfig,
    Qwen3RendererConfig,
    RendererConfig,
    ToolCallParseStatus,
    create_renderer,
)
from renderers.base import Message as RendererMessage
from renderers.base import ToolCall as RendererToolCall
from renderers.base import ToolSpec as RendererTool

from rollout.contracts import Message, ToolCall, ToolSpec

RENDERER_NAMES = ("auto", "chatml", "qwen3")


def renderer_config(name: str) -> RendererConfig | CustomRendererConfig:
    if name == "chatml":
        return CustomRendererConfig(import_path="rollout.rendering.chatml.ChatMLRenderer")
    if name == "qwen3":
        return Qwen3RendererConfig()
    if name == "auto":
        return AutoRendererConfig()
    return CustomRendererConfig(import_path=name)  # `module.Class` or `file.py:Class` of the user's own


def renderer_for_model(spec: str) -> str:
    """The renderer the built-in model specs need; `auto` for anything else."""
    return {"smollm2": "chatml", "tiny-qwen3": "qwen3"}.get(spec, "auto")


@dataclass(frozen=True)
class PrefixParse:
    reasoning: str
    reasoning_open: bool
    text: str
    tool_started: bool


@dataclass(frozen=True)
class ParsedReply:
    message: Message
    parse_failures: tuple[str, ...] = ()


def to_renderer_message(message: Message) -> RendererMessage:
    out = RendererMessage(role=message.role, content=message.text)
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            RendererToolCall(
                type="function", id=call.id, function={"name": call.name, "arguments": call.arguments}
            )
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


def to_renderer_tool(tool: ToolSpec) -> RendererTool:
    return RendererTool(name=tool.name, description=tool.description, parameters=tool.parameters)


class ModelRenderer:
    def __init__(self, tokenizer: Any, renderer_name: str = "auto") -> None:
        self.tokenizer = tokenizer
        self.renderer = create_renderer(tokenizer, renderer_config(renderer_name))

    @staticmethod
    def renderer_message(message: Message) -> RendererMessage:
        return to_renderer_message(message)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(self.renderer.get_stop_token_ids())

    def _tools(self, tools: list[ToolSpec]) -> list[RendererTool] | None:
        return [to_renderer_tool(tool) for tool in tools] or None

    def prompt_ids(self, messages: list[Message], tools: list[ToolSpec]) -> list[int]:
        rendered = [to_renderer_message(m) for m in messages]
        return self.renderer.render_ids(rendered, tools=self._tools(tools), add_generation_prompt=True)

    def conversation_ids(self, messages: list[Message]) -> list[int]:
        """The ids of a whole conversation as the template writes it (no generation prompt after it)."""
        return self.renderer.render_ids([to_renderer_message(m) for m in messages])

    def bridge(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        new_messages: list[Message],
        tools: list[ToolSpec],
    ) -> list[int] | None:
        bridged = self.renderer.bridge_to_next_turn(
            prompt_ids,
            completion_ids,
            [to_renderer_message(m) for m in new_messages],
            tools=self._tools(tools),
        )
        return None if bridged is None else list(bridged.token_ids)

    def parse(self, completion_ids: list[int], tools: list[ToolSpec], prompt_ids: list[int]) -> ParsedReply:
        parsed = self.renderer.parse_response(completion_ids, tools=self._tools(tools), prompt_ids=prompt_ids)
        calls: list[ToolCall] = []
        failures: list[str] = []
        text = parsed.content
        for call in parsed.tool_calls:
            if call.status == ToolCallParseStatus.OK and call.name:
                arguments = (
                    call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments or {})
                )
                calls.append(
                    ToolCall(
                        id=call.id or f"call_{uuid.uuid4().hex[:24]}", name=call.name, arguments=arguments
                    )
                )
            else:
                failures.append(f"{call.status}: {call.raw[:200]}")
                if call.raw not in text:
                    text = f"{text}\n{call.raw}" if text else call.raw
        message = Message(
            role="assistant", text=text, reasoning=parsed.reasoning_content or None, tool_calls=tuple(calls)
        )
        return ParsedReply(message, tuple(failures))

    def parse_prefix(
        self, completion_ids: list[int], tools: list[ToolSpec], prompt_ids: list[int]
    ) -> PrefixParse:
        parsed = self.renderer.parse_response(completion_ids, tools=self._tools(tools), prompt_ids=prompt_ids)
        return PrefixParse(
            reasoning=parsed.reasoning_content or "",
            reasoning_open=parsed.reasoning_complete is False,
            text=parsed.content,
            tool_started=bool(parsed.tool_calls),
        )

    def count(self, messages: list[Message], tools: list[ToolSpec]) -> int:
        return len(self.prompt_ids(messages, tools))
