"""OpenAI Chat Completions' request, as OpenAI publishes it, restricted to what the gateway serves.

Contract:
- `messages`: at least one; each with a role of system, developer, user, assistant or tool. System, developer
  and tool messages carry text (a string or text parts); a tool message names its `tool_call_id`; a user
  message carries text or parts of type text, image_url, input_audio or file; an assistant message may omit
  `content` (or send null) only when it carries `tool_calls` (or the legacy `function_call`), and each call is
  `{id, type: "function", function: {name, arguments}}` with `arguments` a JSON string.
- `temperature` 0–2, `top_p` 0–1, `frequency_penalty` and `presence_penalty` −2–2, `n` 1, `seed` a 64-bit
  integer, `max_tokens` and `max_completion_tokens` at least 1 and at most the model's context, `stop` a
  string or an array of at most 4 strings (OpenAI's cap), each of 1 to 256 characters, `stream` a boolean,
  `tools` function tools with a non-empty name and an object for `parameters`. Each may be null, meaning
  absent.
- `model` is optional (the seat decides what serves it); any other field is accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from rollout.gateway.schemas.validation import (
    Body,
    StopString,
    TokenBudget,
    member,
    one_of,
    rule,
    text_or_list,
)
from rollout.gateway.stops import MAX_STOPS_OPENAI

INT64 = 2**63


class ChatTextPart(Body):
    type: Literal["text"]
    text: str


class ChatRefusalPart(Body):
    type: Literal["refusal"]
    refusal: str


class ChatMediaPart(Body):
    """An image, audio or file part: accepted, and not shown to a text-only model."""

    type: Literal["image_url", "input_audio", "file"]


TextContent = Annotated[
    Annotated[str, member("text")] | Annotated[list[ChatTextPart], member("list")],
    text_or_list("text parts"),
]

UserPart = Annotated[
    Annotated[ChatTextPart, member("text")] | Annotated[ChatMediaPart, member("media")],
    one_of("type", {"text": "text", "image_url": "media", "input_audio": "media", "file": "media"}),
]

AssistantPart = Annotated[
    Annotated[ChatTextPart, member("text")] | Annotated[ChatRefusalPart, member("refusal")],
    one_of("type", {"text": "text", "refusal": "refusal"}),
]


class ChatFunctionCall(Body):
    name: str
    arguments: str


class ChatToolCall(Body):
    id: str
    type: Literal["function"]
    function: ChatFunctionCall


class ChatSystemMessage(Body):
    role: Literal["system", "developer"]
    content: TextContent
    name: str | None = None


class ChatUserMessage(Body):
    role: Literal["user"]
    content: Annotated[
        Annotated[str, member("text")] | Annotated[list[UserPart], member("list")],
        text_or_list("content parts"),
    ]
    name: str | None = None


class ChatAssistantMessage(Body):
    # The validator below, as JSON Schema: content, or a tool call, is there.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
                {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array", "minItems": 1}}},
                {"required": ["function_call"], "properties": {"function_call": {"type": "object"}}},
            ]
        }
    )

    role: Literal["assistant"]
    content: (
        Annotated[
            Annotated[str, member("text")] | Annotated[list[AssistantPart], member("list")],
            text_or_list("content parts"),
        ]
        | None
    ) = None
    tool_calls: list[ChatToolCall] | None = None
    function_call: ChatFunctionCall | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _says_something(self) -> ChatAssistantMessage:
        if self.content is None and not self.tool_calls and self.function_call is None:
            raise rule("is required unless the message carries tool_calls", "content")
        return self


class ChatToolMessage(Body):
    role: Literal["tool"]
    content: TextContent
    tool_call_id: Annotated[str, Field(min_length=1)]


ChatMessage = Annotated[
    Annotated[ChatSystemMessage, member("system")]
    | Annotated[ChatUserMessage, member("user")]
    | Annotated[ChatAssistantMessage, member("assistant")]
    | Annotated[ChatToolMessage, member("tool")],
    one_of(
        "role",
        {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"},
    ),
]


class ChatFunction(Body):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(Body):
    type: Literal["function"]
    function: ChatFunction


class ChatCompletionRequest(Body):
    """`POST /v1/chat/completions`."""

    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[ChatTool] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    max_tokens: TokenBudget | None = None
    max_completion_tokens: TokenBudget | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stop: (
        Annotated[
            Annotated[StopString, member("text")]
            | Annotated[list[StopString], Field(max_length=MAX_STOPS_OPENAI), member("list")],
            text_or_list("strings"),
        ]
        | None
    ) = None
    seed: Annotated[int, Field(ge=-INT64, le=INT64 - 1)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    stream: bool | None = None
