"""The dialect-neutral request and outcome every dialect maps to and from.

Contract:
- `decode_json` reads a request body as strict UTF-8 JSON (no NaN or Infinity, no lone surrogates, no NUL in a
  string) or raises `BadRequest`.
- A `ChatRequest` carries canonical messages, tools and sampling parameters; its `fingerprint` is a stable
  hash of exactly those (so the same request from a retried episode attempt has the same fingerprint); its
  `turn_index` is the number of assistant messages in its history (the k-th model call of a conversation).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from rollout.contracts import Message, SamplingParams, ToolSpec

FinishReason = Literal["stop", "length", "tool_calls"]


class BadRequest(ValueError):
    """The request is malformed; `field` names the offending field (in the dialect's own naming)."""

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(raw: bytes) -> Any:
    """A request body as JSON: UTF-8 only, no NaN or Infinity, no lone surrogates, no NUL in a string (none of
    which could be tokenised or stored); anything else is a `BadRequest`."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        # An escaped lone surrogate ("\\ud800") decodes, but no UTF-8 text holds one.
        if b"\\u" in raw:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):
        raise BadRequest("the request body is not valid JSON") from None
    # An escaped NUL ("\\u0000") is JSON, but the ledger (Postgres text and jsonb) cannot hold one.
    if b"\\u0000" in raw and _holds_nul(body):
        raise BadRequest(
            "the request body holds a NUL character (\\u0000) in a string, which cannot be recorded"
        )
    return body


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


def canonical_arguments(arguments: str) -> str:
    """Tool-call arguments in one spelling: parsed and re-serialised when they are JSON, verbatim
    otherwise."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (json.JSONDecodeError, TypeError):
        return arguments


def canonical_message(message: Message) -> dict[str, Any]:
    """What identifies a message for fingerprints and for matching a client's echo of a reply."""
    return {
        "role": message.role,
        "text": message.text.strip(),
        "tool_calls": [[c.name, canonical_arguments(c.arguments)] for c in message.tool_calls],
        "tool_call_id": message.tool_call_id,
    }


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def messages_digest(messages: tuple[Message, ...] | list[Message]) -> str:
    return digest([canonical_message(m) for m in messages])


def tools_digest(tools: tuple[ToolSpec, ...]) -> str:
    return digest([tool.model_dump(mode="json") for tool in tools])


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    params: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False

    @property
    def turn_index(self) -> int:
        return sum(1 for m in self.messages if m.role == "assistant")

    @cached_property
    def messages_sha(self) -> str:
        return messages_digest(self.messages)

    @cached_property
    def tools_sha(self) -> str:
        return tools_digest(self.tools)

    @cached_property
    def fingerprint(self) -> str:
        return digest([self.messages_sha, self.tools_sha, self.params.model_dump(mode="json")])


@dataclass(frozen=True)
class Turn:
    """What the gateway answers with, whatever the dialect."""

    reply: Message
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    turn_index: int
    model: str
    stop_sequence: str | None = None
    replayed: bool = False
    cached_tokens: int = 0  # prompt tokens the engine did not compute again (its prefix cache)
