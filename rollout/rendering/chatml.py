"""A ChatML renderer (SmolLM2 and other `<|im_start|>role` models) on the `renderers` extension point.

`renderers` ships hand-written renderers for the big model families but none for plain ChatML templates such
as SmolLM2-Instruct's. This one follows that template token for token (including its default system prompt)
and adds what the template lacks, in the Hermes convention most ChatML fine-tunes use:
- tools are described in the system turn; a call is `<tool_call>\\n{"name": ..., "arguments":
  ...}\\n</tool_call>`;
- tool results come back as a `tool` turn;
- reasoning is a leading `<think>...</think>` block of the assistant turn.

Contract (the `renderers.Renderer` protocol):
- `render(messages, add_generation_prompt=True)` equals the model's own chat template for plain text messages.
- `bridge_to_next_turn` keeps the previous prompt and sampled ids verbatim and appends only the new messages
  and the generation prompt; it refuses (returns None) when the new messages contain an assistant turn.
- `parse_response` never raises: a tool call that is not valid JSON is reported with its parse status and kept
  in the text.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, ClassVar

from renderers.base import (
    Message,
    ParsedResponse,
    ParsedToolCall,
    RenderedTokens,
    Tokenizer,
    ToolCallParseStatus,
    ToolSpec,
    trim_to_turn_close,
)
from renderers.configs import BaseRendererConfig

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

_TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_INSTRUCTIONS = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(</tool_call>|$)", re.DOTALL)
_THINK = re.compile(r"^\s*<think>(.*?)(</think>|$)\s*", re.DOTALL)


class ChatMLRendererConfig(BaseRendererConfig):
    name: str = "chatml"
    default_system: str | None = SMOLLM2_SYSTEM
    """The system turn the template adds when the conversation has none (None: add nothing)."""

    _internal_fields: ClassVar[frozenset[str]] = frozenset({"default_system"})


class ChatMLRenderer:
    config_class = ChatMLRendererConfig

    def __init__(self, tokenizer: Tokenizer, config: ChatMLRendererConfig | None = None) -> None:
        self._tokenizer = tokenizer
        self.config = config or ChatMLRendererConfig()
        self._im_start = self._special("<|im_start|>")
        self._im_end = self._special("<|im_end|>")

    def _special(self, token: str) -> int:
        token_id = self._tokenizer.convert_tokens_to_ids(token)
        if not isinstance(token_id, int):
            raise ValueError(f"the tokenizer has no {token} token: not a ChatML model")
        return token_id

    @property
    def is_prefix_stable(self) -> bool:
        return True

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False) if text else []

    def _body(self, message: Message, tools: list[ToolSpec] | None, first: bool) -> str:
        content = message.get("content")
        text = (
            content
            if isinstance(content, str)
            else "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))
        )
        if message.get("role") == "system" and first and tools:
            text += (
                _TOOLS_PREAMBLE
                + "".join("\n" + json.dumps({"type": "function", "function": tool}) for tool in tools)
                + _TOOLS_INSTRUCTIONS
            )
        if message.get("role") == "assistant":
            reasoning = message.get("reasoning_content")
            if reasoning:
                text = f"<think>\n{reasoning}\n</think>\n\n{text}"
            for call in message.get("tool_calls") or []:
                function: Any = call.get("function", {})
                arguments = function.get("arguments", {})
                if isinstance(arguments, str):
                    with contextlib.suppress(
                        json.JSONDecodeError
                    ):  # keep non-JSON arguments as the model wrote them
                        arguments = json.loads(arguments)
                payload = json.dumps({"name": function.get("name"), "arguments": arguments})
                text += ("\n" if text else "") + f"<tool_call>\n{payload}\n</tool_call>"
        return text

    def _render_turns(
        self, messages: list[Message], tools: list[ToolSpec] | None, *, offset: int, with_system: bool
    ) -> RenderedTokens:
        out = RenderedTokens()
        turns: list[tuple[int, Message]] = list(enumerate(messages))
        needs_system = self.config.default_system is not None or bool(tools)
        if with_system and needs_system and (not messages or messages[0].get("role") != "system"):
            system: Message = {"role": "system", "content": self.config.default_system or ""}
            turns.insert(0, (-1, system))
        for position, (index, message) in enumerate(turns):
            role = str(message.get("role"))
            body = self._body(message, tools, first=with_system and position == 0)
            sampled = role == "assistant"
            pieces = [
                ([self._im_start], False, False),
                (self._encode(f"{role}\n"), False, False),
                (self._encode(body), sampled, True),
                ([self._im_end], sampled, False),
                (self._encode("\n"), False, False),
            ]
            for ids, is_sampled, is_content in pieces:
                out.token_ids.extend(ids)
                out.message_indices.extend([index + offset if index >= 0 else -1] * len(ids))
                out.sampled_mask.extend([is_sampled] * len(ids))
                out.is_content.extend([is_content] * len(ids))
        out.message_roles = [str(m.get("role")) for m in messages]
        out.message_tool_names = [None] * len(messages)
        return out

    def _add_generation_prompt(self, out: RenderedTokens) -> RenderedTokens:
        ids = [self._im_start, *self._encode("assistant\n")]
        out.token_ids.extend(ids)
        out.message_indices.extend([-1] * len(ids))
        out.sampled_mask.extend([False] * len(ids))
        out.is_content.extend([False] * len(ids))
        return out

    def render(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSpec] | None = None,
        add_generation_prompt: bool = False,
    ) -> RenderedTokens:
        if not messages:
            raise ValueError("No messages provided.")
        out = self._render_turns(messages, tools, offset=0, with_system=True)
        return self._add_generation_prompt(out) if add_generation_prompt else out

    def render_ids(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSpec] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        return self.render(messages, tools=tools, add_generation_prompt=add_generation_prompt).token_ids

    def get_stop_token_ids(self) -> list[int]:
        return [self._im_end]

    def bridge_to_next_turn(
        self,
        previous_prompt_ids: list[int],
        previous_completion_ids: list[int],
        new_messages: list[Message],
        *,
        tools: list[ToolSpec] | None = None,
    ) -> RenderedTokens | None:
        if any(message.get("role") == "assistant" for message in new_messages):
            return None
        prior = trim_to_turn_close(
            previous_prompt_ids, previous_completion_ids, {self._im_end}, synthesize_close=self._im_end
        )
        if prior is None:
            return None
        separator = self._encode("\n")
        added = self._render_turns(new_messages, tools, offset=0, with_system=False)
        out = RenderedTokens(
            token_ids=[*prior, *separator, *added.token_ids],
            message_indices=[-1] * (len(prior) + len(separator)) + added.message_indices,
            sampled_mask=[False] * (len(prior) + len(separator) + len(added.token_ids)),
            is_content=[False] * (len(prior) + len(separator)) + added.is_content,
            message_roles=added.message_roles,
            message_tool_names=added.message_tool_names,
        )
        return self._add_generation_prompt(out)

    def parse_response(
        self,
        token_ids: list[int],
        *,
        tools: list[ToolSpec] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> ParsedResponse:
        ids = list(token_ids)
        while ids and ids[-1] in (self._im_end,):
            ids.pop()
        text = self._tokenizer.decode(ids)
        reasoning: str | None = None
        reasoning_complete: bool | None = True
        think = _THINK.match(text)
        if think:
            reasoning, reasoning_complete = think.group(1).strip(), bool(think.group(2))
            text = text[think.end() :]
        calls: list[ParsedToolCall] = []
        first_call = text.find("<tool_call>")
        content = text if first_call < 0 else text[:first_call].rstrip()
        for match in _TOOL_CALL.finditer(text, max(first_call, 0)) if first_call >= 0 else ():
            raw = match.group(0)
            if not match.group(2):
                calls.append(ParsedToolCall(raw=raw, status=ToolCallParseStatus.UNCLOSED_BLOCK))
                continue
            try:
                payload = json.loads(match.group(1))
            except json.JSONDecodeError:
                calls.append(ParsedToolCall(raw=raw, status=ToolCallParseStatus.INVALID_JSON))
                continue
            if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
                calls.append(ParsedToolCall(raw=raw, status=ToolCallParseStatus.MISSING_NAME))
                continue
            arguments = payload.get("arguments", {})
            calls.append(ParsedToolCall(raw=raw, name=payload["name"], arguments=arguments))
        if any(call.status != ToolCallParseStatus.OK for call in calls):
            content = text.strip() if first_call >= 0 else content  # keep the malformed block visible as text
        return ParsedResponse(
            content=content,
            reasoning_content=reasoning,
            tool_calls=calls,
            reasoning_complete=reasoning_complete,
        )
