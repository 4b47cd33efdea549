"""Helpers shared by the dialects: typed field access that names the field on error, SSE framing, ids, and the
`StreamWriter` each dialect streams a turn with.

A `StreamWriter` writes one streamed turn's SSE frames in order: `start` (the model and prompt size are known
before the first token), `delta` for each piece of reasoning or text as it is settled (all reasoning comes
before any text), then `end` with the whole turn: the frames still to send (tool calls, the finish reason,
usage) and, apart, the terminating frames, which are sent only once the turn is recorded. `frames_of` writes a
turn that is already whole (a replay, an external model's reply) the same way, its text in `TEXT_CHUNK`
pieces.

`answered_call` is each dialect's check that a tool result answers a call an earlier assistant message made:
the three APIs refuse one that does not with a 400, and so do we.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal, Protocol

from rollout.contracts import ToolSpec
from rollout.gateway.requests import BadRequest, ChatRequest, Turn

TEXT_CHUNK = 24  # characters per streamed text delta


class Dialect(Protocol):
    name: str

    def parse(self, body: Any, *, max_context: int | None = None) -> ChatRequest:
        """Validate `body` against the dialect's schema (a token budget over `max_context` is refused too),
        then map it; a `BadRequest` names the offending field."""
        ...

    def response(self, turn: Turn) -> dict[str, Any]: ...
    def writer(self) -> StreamWriter:
        """A writer for one streamed turn's frames."""
        ...

    def error(self, status: int, message: str, field: str | None) -> dict[str, Any]: ...


class StreamWriter(Protocol):
    def start(self, model: str, prompt_tokens: int) -> list[bytes]: ...
    def delta(self, kind: Literal["reasoning", "text"], text: str) -> list[bytes]: ...
    def end(self, turn: Turn) -> tuple[list[bytes], list[bytes]]:
        """(the frames still to send, the terminating frames sent after the turn is recorded)"""
        ...


def frames_of(writer: StreamWriter, turn: Turn) -> tuple[list[bytes], list[bytes]]:
    """A whole turn's frames: (all but the terminating ones, the terminating ones)."""
    frames = writer.start(turn.model, turn.prompt_tokens)
    for piece in chunks(turn.reply.reasoning or ""):
        frames += writer.delta("reasoning", piece)
    for piece in chunks(turn.reply.text):
        frames += writer.delta("text", piece)
    rest, last = writer.end(turn)
    return frames + rest, last


def answered_call(call_id: str, made: set[str], field: str) -> str:
    """`call_id` when it names a tool call in `made` (those of the conversation's earlier assistant messages);
    else `BadRequest` naming `field`."""
    if call_id not in made:
        raise BadRequest(
            f"'{field}' answers tool call {call_id!r}, which no earlier assistant message made", field=field
        )
    return call_id


def obj(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"'{field}' must be an object", field=field)
    return value


def get(
    body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None, *, prefix: str = ""
) -> Any:
    """`body[name]` if it has the right type, `default` if absent or null; a clear error otherwise."""
    value = body.get(name)
    if value is None:
        return default
    wrong_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if not isinstance(value, kind) or wrong_bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRequest(f"'{prefix}{name}' must be {_type_word(names)}", field=f"{prefix}{name}")
    return value


def _type_word(names: str) -> str:
    words = {
        "str": "a string",
        "int": "an integer",
        "float": "a number",
        "list": "an array",
        "dict": "an object",
        "bool": "a boolean",
        "int or float": "a number",
    }
    return words.get(names, names)


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {payload}\n\n".encode()


def chunks(text: str) -> list[str]:
    return [text[i : i + TEXT_CHUNK] for i in range(0, len(text), TEXT_CHUNK)] or []


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def text_of(content: Any, field: str, accepted: tuple[str, ...] = ("text",)) -> str:
    """Text from a string or a list of text parts (`{"type": "text", "text": ...}`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in accepted and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            elif not isinstance(part, dict):
                raise BadRequest(
                    f"'{field}[{index}]' must be a content part object", field=f"{field}[{index}]"
                )
        return "".join(parts)
    raise BadRequest(f"'{field}' must be a string or an array of content parts", field=field)


def function_tool(body: dict[str, Any], field: str, *, schema_key: str = "parameters") -> ToolSpec:
    """A tool from an object with a name, a description and a JSON Schema under `schema_key`."""
    name = get(body, "name", str, None, prefix=f"{field}.")
    if not name:
        raise BadRequest(f"'{field}.name' is required", field=f"{field}.name")
    schema = obj(body.get(schema_key) or {"type": "object", "properties": {}}, f"{field}.{schema_key}")
    return ToolSpec(name=name, description=body.get("description") or "", parameters=schema)
