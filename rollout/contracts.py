"""The data every part of rollout exchanges: messages, tools, and sampled turns.

Contract:
- Values are immutable pydantic models; they round-trip through JSON unchanged (`model_dump(mode="json")`
  then `model_validate`), which is how they travel in ledger payloads and over HTTP.
- A `Message` is dialect-neutral. The gateway maps OpenAI Chat, OpenAI Responses and Anthropic Messages
  onto it and back; nothing here knows a dialect.
- A `SampledTurn` is the training record of one model call: the exact prompt token ids the engine saw, the
  exact completion ids it sampled, one behaviour logprob per completion id, and the checkpoint that sampled
  them. `len(completion_logprobs) == len(completion_ids)` always holds.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


class SampledTurn(Contract):
    """One model call as training sees it: exact token ids, behaviour logprobs, who sampled them.

    `segment_id` groups the turns whose token ids extend each other verbatim; such a chain trains as one
    sequence. `checkpoint` is the id of the checkpoint the engine served when it sampled this turn.
    """

    seat: str
    turn_index: int = Field(ge=0)
    segment_id: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...]
    checkpoint: str
    engine: str
    finish_reason: Literal["stop", "length", "tool_calls"] = "stop"

    @model_validator(mode="after")
    def _one_logprob_per_token(self) -> SampledTurn:
        if len(self.completion_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.completion_logprobs)} logprobs: "
                "every sampled token needs its behaviour logprob"
            )
        return self

    @property
    def sequence_ids(self) -> tuple[int, ...]:
        """Prompt then completion: the ids the engine saw and produced, in order."""
        return self.prompt_ids + self.completion_ids
