"""OpenAI Responses' request, as OpenAI publishes it, restricted to what the gateway serves.

Contract:
- `input` is a string or an array of items. A `message` item (the type may be omitted) has a role of user,
  assistant, system or developer and content as a string or parts of type input_text, output_text, text,
  refusal, input_image, input_file or input_audio (text parts need `text`); any other part type is refused.
  `function_call` / `custom_tool_call` items carry `call_id`, `name` and `arguments` / `input` as strings;
  their outputs carry a non-empty `call_id` and `output`; a `reasoning` item's `summary` holds summary_text
  parts. Items of other types (web_search_call, local_shell_call, item_reference, ...) are accepted and
  skipped.
- `max_output_tokens` is at least 1 (OpenAI's own API asks for at least 16; a local model's turn may be
  shorter) and at most the model's context; `temperature` 0–2, `top_p` 0–1, `instructions` a string, `stream`
  a boolean. Function tools need a non-empty `name` and an object for `parameters`; tools of other types are
  accepted and not offered to the model. Each may be null, meaning absent.
- `model` is optional (the seat decides what serves it); any other field is accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from rollout.gateway.schemas.validation import Body, TokenBudget, member, one_of, text_or_list

ITEMS = {
    "message": "message",
    "function_call": "function_call",
    "custom_tool_call": "custom_tool_call",
    "function_call_output": "output",
    "custom_tool_call_output": "output",
    "reasoning": "reasoning",
}


class ResponsesTextPart(Body):
    type: Literal["input_text", "output_text", "text"]
    text: str


class ResponsesRefusalPart(Body):
    type: Literal["refusal"]
    refusal: str


class ResponsesMediaPart(Body):
    """An image, file or audio part: accepted, and not shown to a text-only model."""

    type: Literal["input_image", "input_file", "input_audio"]


ResponsesPart = Annotated[
    Annotated[ResponsesTextPart, member("text")]
    | Annotated[ResponsesRefusalPart, member("refusal")]
    | Annotated[ResponsesMediaPart, member("media")],
    one_of(
        "type",
        {
            "input_text": "text",
            "output_text": "text",
            "text": "text",
            "refusal": "refusal",
            "input_image": "media",
            "input_file": "media",
            "input_audio": "media",
        },
    ),
]

ResponsesContent = Annotated[
    Annotated[str, member("text")] | Annotated[list[ResponsesPart], member("list")],
    text_or_list("content parts"),
]


class ResponsesMessage(Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: ResponsesContent


class ResponsesFunctionCall(Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class ResponsesCustomToolCall(Body):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str


class ResponsesCallOutput(Body):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: Annotated[str, Field(min_length=1)]  # the call it answers
    output: ResponsesContent


class ResponsesSummaryPart(Body):
    type: Literal["summary_text"]
    text: str


class ResponsesReasoningPart(Body):
    type: Literal["reasoning_text"]
    text: str


class ResponsesReasoning(Body):
    type: Literal["reasoning"]
    summary: list[ResponsesSummaryPart] = Field(default_factory=list)
    content: list[ResponsesReasoningPart] | None = None


class ResponsesOtherItem(Body):
    """An item of a type the gateway does not use: accepted and skipped."""

    type: Annotated[str, Field(json_schema_extra={"not": {"enum": list(ITEMS)}})]


ResponsesItem = Annotated[
    Annotated[ResponsesMessage, member("message")]
    | Annotated[ResponsesFunctionCall, member("function_call")]
    | Annotated[ResponsesCustomToolCall, member("custom_tool_call")]
    | Annotated[ResponsesCallOutput, member("output")]
    | Annotated[ResponsesReasoning, member("reasoning")]
    | Annotated[ResponsesOtherItem, member("other")],
    one_of("type", ITEMS, default="message", other=True),
]


class ResponsesFunctionTool(Body):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ResponsesOtherTool(Body):
    """A tool of another type (web_search, local_shell, custom, ...): accepted, not offered to the model."""

    type: Annotated[str, Field(json_schema_extra={"not": {"const": "function"}})]


ResponsesTool = Annotated[
    Annotated[ResponsesFunctionTool, member("function")] | Annotated[ResponsesOtherTool, member("other")],
    one_of("type", {"function": "function"}, other=True),
]


class ResponsesRequest(Body):
    """`POST /v1/responses`."""

    model: str | None = None
    input: Annotated[
        Annotated[str, member("text")] | Annotated[list[ResponsesItem], member("list")],
        text_or_list("input items"),
    ]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    max_output_tokens: TokenBudget | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    stream: bool | None = None
