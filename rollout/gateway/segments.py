"""Token-exact segments: when a request extends an earlier turn, the earlier ids are reused verbatim.

A seat's conversation is a chain of turns. A request *extends* a turn when its messages are that turn's
request messages, then that turn's reply (as the client echoes it back), then only new non-assistant messages,
with the same tools. The new prompt is then the earlier prompt + sampled ids + the rendering of the new
messages; nothing sampled is ever re-tokenised. Turns chained like this form one segment, which trains as one
sequence. Anything else (compaction, an edited history, other tools) starts a new segment.

A new segment's first turn records the conversation's opening (`conversation_opening`), by which an
environment tells a client's side tasks from its main conversation.

Pure functions over `Head`s (the newest turn of each segment); no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout.contracts import Message
from rollout.gateway.requests import ChatRequest, canonical_message, messages_digest

MAX_HEADS = 8  # segments a seat keeps open at once (side conversations such as title generation included)


@dataclass(frozen=True)
class Head:
    """The newest turn of a segment, with the full ids it produced."""

    segment_id: str
    seq: int
    n_messages: int
    messages_sha: str
    tools_sha: str
    reply: Message
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


@dataclass(frozen=True)
class Extension:
    head: Head
    new_messages: tuple[Message, ...]


def replies_match(echoed: Message, reply: Message) -> bool:
    """Does the client's copy of an assistant message say what the model said? Reasoning may be dropped."""
    mine, theirs = canonical_message(reply), canonical_message(echoed)
    return (
        mine["role"] == theirs["role"]
        and mine["text"] == theirs["text"]
        and mine["tool_calls"] == theirs["tool_calls"]
    )


def find_extension(request: ChatRequest, heads: list[Head]) -> Extension | None:
    """The newest head that `request` extends, with the messages it adds; None when it extends none."""
    tools_sha = request.tools_sha
    messages = request.messages
    for head in sorted(heads, key=lambda h: h.seq, reverse=True):
        n = head.n_messages
        if head.tools_sha != tools_sha or len(messages) <= n + 1:
            continue
        new = messages[n + 1 :]
        if any(m.role == "assistant" for m in new):
            continue
        if messages_digest(messages[:n]) == head.messages_sha and replies_match(messages[n], head.reply):
            return Extension(head, new)
    return None


# How much of each text an opening keeps: enough to get past the reminders CLIs put first (Claude Code's first
# user message opens with a ~290-character <system-reminder>).
OPENING_CHARS = 1000


def conversation_opening(request: ChatRequest) -> dict[str, Any]:
    """What a new segment's first request says about the conversation it starts (recorded with that turn): the
    model the client asked for, the tools it offered, and the start of its system prompt, of its first user
    message and of its last one. An environment tells a side task (a title, a sub-agent, a compaction request)
    from the task itself by these: a sub-agent has its own system prompt, a compaction request ends with the
    client's instruction to summarise."""
    system = next((m.text for m in request.messages if m.role in ("system", "developer")), "")
    users = [m.text for m in request.messages if m.role == "user"]
    return {
        "model": request.model,
        "tools": [tool.name for tool in request.tools],
        "system": system[:OPENING_CHARS],
        "first_user": (users[0] if users else "")[:OPENING_CHARS],
        "last_user": (users[-1] if users else "")[:OPENING_CHARS],
    }


def advance(heads: list[Head], new_head: Head) -> list[Head]:
    """The heads after a turn: the new turn replaces its segment's head; the oldest segments fall off."""
    kept = [h for h in heads if h.segment_id != new_head.segment_id]
    return sorted([*kept, new_head], key=lambda h: h.seq)[-MAX_HEADS:]
