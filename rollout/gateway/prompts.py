"""The prompt a turn is sampled from, under the segment rules of rollout.gateway.segments.

Contract:
- `render_prompt(renderer, heads, seat_id, request, max_context)` extends the seat's segment the request
  continues (the earlier ids verbatim, bridged to the new messages) or renders a new segment (a fresh id under
  the seat, with the conversation's opening). A prompt that leaves no room in `max_context` is a `BadRequest`;
  the turn's token budget is what the request asked for, capped by the room left.
- `rendered_off_the_loop(...)` is `render_prompt`, on one rendering thread of its own when the request holds
  `OFF_LOOP_CHARS` characters or more (its messages and the tools it offers): a long observation takes its
  hundreds of milliseconds there, and every other seat's turn goes on meanwhile. Smaller ones render in place
  (a thread hop would cost them more). `counted_off_the_loop(renderer, request)` counts a whole prompt's
  tokens (Anthropic's `count_tokens`) by the same rule.
- `Prepared` is a prompt rendered ahead for a seat (`Gateway.prepare`), or the `BadRequest` its rendering
  raised, kept to be raised when it is used.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from rollout.gateway.requests import BadRequest, ChatRequest
from rollout.gateway.segments import Head, conversation_opening, find_extension
from rollout.rendering import ModelRenderer


@dataclass(frozen=True)
class Prompt:
    """A turn's rendered prompt and where it goes: its segment and the prefix shared with the segment so
    far."""

    ids: list[int]
    segment_id: str
    prefix: int
    max_tokens: int
    started: float
    rendered_at: float
    opening: dict[str, Any] | None  # a new segment's: its conversation's opening
    renderer: ModelRenderer  # what rendered it: its turn is cut, parsed and stopped with the same model's


OFF_LOOP_CHARS = 8192  # about 2,000 tokens: rendering takes a few milliseconds from here on, and grows fast
# One thread: long renders wait for each other, never for the event loop. Short ones render on the loop
# meanwhile: the fast tokenizer's `encode` changes no state of the tokenizer's, so the two never collide.
_RENDERING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-render")


def _characters(request: ChatRequest) -> int:
    # What the template renders: the messages and the tools offered (a tool's schema may be most of a body).
    messages = sum(
        len(m.text) + len(m.reasoning or "") + sum(len(c.arguments) for c in m.tool_calls)
        for m in request.messages
    )
    return messages + sum(len(t.name) + len(t.description) + len(str(t.parameters)) for t in request.tools)


async def rendered_off_the_loop(
    renderer: ModelRenderer, heads: list[Head], seat_id: str, request: ChatRequest, max_context: int
) -> Prompt:
    return await _off_the_loop(request, render_prompt, renderer, heads, seat_id, request, max_context)


async def counted_off_the_loop(renderer: ModelRenderer, request: ChatRequest) -> int:
    """How many tokens `request`'s whole prompt renders to (Anthropic's `count_tokens`)."""
    return await _off_the_loop(request, renderer.count, list(request.messages), list(request.tools))


async def _off_the_loop[**P, R](
    request: ChatRequest, render: Callable[P, R], *args: P.args, **kwargs: P.kwargs
) -> R:
    if _characters(request) < OFF_LOOP_CHARS:
        return render(*args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_RENDERING, partial(render, *args, **kwargs))


@dataclass(frozen=True)
class Prepared:
    """A turn rendered ahead for `seat_id` (`Gateway.prepare`): its prompt, or why it cannot be rendered."""

    seat_id: str
    prompt: Prompt | BadRequest


def render_prompt(
    renderer: ModelRenderer, heads: list[Head], seat_id: str, request: ChatRequest, max_context: int
) -> Prompt:
    started = time.perf_counter()
    extension = find_extension(request, heads)
    tools = list(request.tools)
    prompt: list[int] | None = None
    if extension is not None:
        head = extension.head
        prompt = renderer.bridge(
            list(head.prompt_ids), list(head.completion_ids), list(extension.new_messages), tools
        )
    opening = None
    if prompt is None or extension is None:
        prompt = renderer.prompt_ids(list(request.messages), tools)
        segment_id, prefix = f"{seat_id}/{uuid.uuid4().hex[:12]}", 0
        opening = conversation_opening(request)
    else:
        segment_id = extension.head.segment_id
        prior = extension.head.prompt_ids + extension.head.completion_ids
        prefix = next(
            (i for i, (a, b) in enumerate(zip(prior, prompt, strict=False)) if a != b),
            min(len(prior), len(prompt)),
        )
    budget = max_context - len(prompt)
    if budget <= 0:
        raise BadRequest(
            f"the prompt is {len(prompt)} tokens; the model's context is {max_context}", field="messages"
        )
    max_tokens = min(request.params.max_tokens or budget, budget)
    return Prompt(prompt, segment_id, prefix, max_tokens, started, time.perf_counter(), opening, renderer)
