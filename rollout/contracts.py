"""The data every part of rollout exchanges: messages, tools and sampling parameters.

Contract:
- Values are immutable pydantic models; they round-trip through JSON unchanged (`model_dump(mode="json")`
  then `model_validate`), which is how they travel in ledger payloads and over HTTP.
- A `Message` is dialect-neutral. The gateway maps OpenAI Chat, OpenAI Responses and Anthropic Messages
  onto it and back; nothing here knows a dialect.
- The training record of one model call is the ledger's `rollout.ledger.payloads.SampledTurn`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The author API: what an environment's author imports (kept stable across releases).
__all__ = [
    "Message",
    "Role",
    "SamplingParams",
    "ToolCall",
    "ToolSpec",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]


class Contract(BaseModel):
    """Base for every contract value: frozen and strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(Contract):
    """A call the assistant asked for. `arguments` is the JSON text the model produced, kept verbatim."""

    id: str
    name: str
    arguments: str = "{}"


class ToolSpec(Contract):
    """A tool offered to the model: a name, a description and a JSON Schema for its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Message(Contract):
    """One chat message in canonical form.

    `text` is the visible content; `reasoning` the model's thinking, when the model produced any;
    `tool_calls` the calls an assistant message makes; a `tool` message answers `tool_call_id`.
    """

    role: Role
    text: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _check_roles(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only assistant messages make tool calls, not {self.role!r}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message must name the tool_call_id it answers")
        return self

    @classmethod
    def system(cls, text: str) -> Message:
        return cls(role="system", text=text)

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role="user", text=text)

    @classmethod
    def assistant(
        cls, text: str, *, tool_calls: tuple[ToolCall, ...] = (), reasoning: str | None = None
    ) -> Message:
        return cls(role="assistant", text=text, tool_calls=tool_calls, reasoning=reasoning)

    @classmethod
    def tool(cls, tool_call_id: str, text: str) -> Message:
        return cls(role="tool", text=text, tool_call_id=tool_call_id)


class SamplingParams(Contract):
    """What the agent asked the engine for."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
