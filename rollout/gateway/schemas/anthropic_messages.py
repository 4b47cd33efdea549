"""Anthropic Messages' request (and count_tokens'), as Anthropic publishes it, restricted to what the gateway
serves.

Contract:
- `messages`: at least one, each with a role of user or assistant (or system: Claude Code sends its system
  prompt there too) and content as a string or an array of content blocks: text, image, document,
  search_result, tool_use (`id`, `name`, an object `input`), tool_result (a non-empty `tool_use_id`; content a
  string or text, image, document and search_result blocks), thinking (`thinking`, `signature`),
  redacted_thinking, or one of Anthropic's server-tool blocks (server_tool_use, web_search_tool_result,
  mcp_tool_use, ...). Any other block type is refused.
- `system` is a string or text blocks. A tool is a client tool (a non-empty `name` and an object
  `input_schema`) or a server tool (a `type` such as `web_search_20250305`, not offered to the model).
- `/v1/messages` also requires `max_tokens`, at least 1 and at most the model's context; `temperature` and
  `top_p` 0–1, `top_k` at least 0, `stop_sequences` at most 16 strings (Anthropic documents no cap; each is
  matched against the whole reply) of 1 to 256 characters, `stream` a boolean. Each but `max_tokens` may be
  null, meaning absent.
- `model` is optional (the seat decides what serves it); any other field is accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Discriminator, Field

from rollout.gateway.schemas.validation import (
    MARK,
    Body,
    StopString,
    TokenBudget,
    member,
    one_of,
    text_or_list,
)
from rollout.gateway.stops import MAX_STOPS_ANTHROPIC

ServerBlockType = Literal[
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "mcp_tool_use",
    "mcp_tool_result",
    "container_upload",
]
SERVER_BLOCKS: tuple[str, ...] = get_args(ServerBlockType)


class AnthropicTextBlock(Body):
    type: Literal["text"]
    text: str


class AnthropicMediaBlock(Body):
    """An image or a document: the gateway's text-only models refuse them in a user message."""

    type: Literal["image", "document"]
    source: dict[str, Any]


class AnthropicSearchResult(Body):
    type: Literal["search_result"]


ResultBlock = Annotated[
    Annotated[AnthropicTextBlock, member("text")]
    | Annotated[AnthropicMediaBlock, member("media")]
    | Annotated[AnthropicSearchResult, member("search_result")],
    one_of("type", {"text": "text", "image": "media", "document": "media", "search_result": "search_result"}),
]


class AnthropicToolUse(Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicToolResult(Body):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]  # the call it answers
    content: (
        Annotated[
            Annotated[str, member("text")] | Annotated[list[ResultBlock], member("list")],
            text_or_list("content blocks"),
        ]
        | None
    ) = None
    is_error: bool | None = None


class AnthropicThinking(Body):
    type: Literal["thinking"]
    thinking: str
    signature: str


class AnthropicRedactedThinking(Body):
    type: Literal["redacted_thinking"]
    data: str


class AnthropicServerBlock(Body):
    """A block of one of Anthropic's server tools: accepted, and not shown to the model."""

    type: ServerBlockType


Block = Annotated[
    Annotated[AnthropicTextBlock, member("text")]
    | Annotated[AnthropicMediaBlock, member("media")]
    | Annotated[AnthropicSearchResult, member("search_result")]
    | Annotated[AnthropicToolUse, member("tool_use")]
    | Annotated[AnthropicToolResult, member("tool_result")]
    | Annotated[AnthropicThinking, member("thinking")]
    | Annotated[AnthropicRedactedThinking, member("redacted_thinking")]
    | Annotated[AnthropicServerBlock, member("server")],
    one_of(
        "type",
        {
            "text": "text",
            "image": "media",
            "document": "media",
            "search_result": "search_result",
            "tool_use": "tool_use",
            "tool_result": "tool_result",
            "thinking": "thinking",
            "redacted_thinking": "redacted_thinking",
        }
        | dict.fromkeys(SERVER_BLOCKS, "server"),
    ),
]


class AnthropicMessage(Body):
    role: Literal["user", "assistant", "system"]
    content: Annotated[
        Annotated[str, member("text")] | Annotated[list[Block], member("list")],
        text_or_list("content blocks"),
    ]


class AnthropicTool(Body):
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    input_schema: dict[str, Any]


class AnthropicServerTool(Body):
    """One of Anthropic's server tools (web search, code execution, ...): accepted, not offered to the
    model."""

    model_config = ConfigDict(json_schema_extra={"not": {"required": ["input_schema"]}})

    type: Annotated[str, Field(json_schema_extra={"not": {"const": "custom"}})]


def _tool_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if "input_schema" in value or kind in (None, "custom"):
        return MARK + "client"
    return MARK + "server" if isinstance(kind, str) else None


Tool = Annotated[
    Annotated[AnthropicTool, member("client")] | Annotated[AnthropicServerTool, member("server")],
    Discriminator(
        _tool_kind,
        custom_error_type="tool",
        custom_error_message="must be an object: a tool with an input_schema, or a server tool with a type",
    ),
]


class CountTokensRequest(Body):
    """`POST /v1/messages/count_tokens`."""

    model: str | None = None
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: (
        Annotated[
            Annotated[str, member("text")] | Annotated[list[AnthropicTextBlock], member("list")],
            text_or_list("text blocks"),
        ]
        | None
    ) = None
    tools: list[Tool] | None = None


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: TokenBudget
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=MAX_STOPS_ANTHROPIC)] | None = None
    stream: bool | None = None
