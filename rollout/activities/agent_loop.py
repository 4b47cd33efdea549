"""The built-in agent loop: a `Task` talks to the model through the gateway, turn by turn, until it ends.

Contract:
- The conversation is the Task's observations and the model's replies, in order; each request sends all of it
  (with the tools of the latest observation) to the seat's OpenAI-compatible base URL. The gateway turns that
  into token-exact segments and records each turn.
- A deterministic Task replays: a retried attempt sends the same requests, the gateway answers them from the
  recorded turns, and sampling continues where the first attempt stopped.
- The loop ends at the Task's `End` (its reward) or after `max_turns` model calls (reward 0, `truncated`).
- A reward that is not a finite number is an `InvalidReward`; an exception from the Task becomes `TaskFailed`
  with its traceback (the episode fails with it recorded), apart from the model's errors, which propagate.
- `on_turn` is called after every model reply (the activity heartbeats there).
"""

from __future__ import annotations

import asyncio
import math
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import openai

from rollout.contracts import Message, ToolCall, ToolSpec
from rollout.harness import End, Observation, RunContext, Task


class InvalidReward(ValueError):
    """A Task ended with a reward that is not a finite number."""


class TaskFailed(RuntimeError):
    """The environment's Task raised; the message carries its traceback."""


async def _task_step[T](step: Awaitable[T], what: str) -> T:
    try:
        return await step
    except Exception as error:
        raise TaskFailed(f"the task's {what} raised:\n{traceback.format_exc()}") from error


@dataclass(frozen=True)
class LoopOutcome:
    reward: float
    turns: int
    truncated: bool = False
    metrics: dict[str, float] = field(default_factory=dict[str, float])


class ChatModel(Protocol):
    async def reply(self, messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message: ...


def chat_message(message: Message) -> dict[str, Any]:
    """A message in OpenAI Chat Completions' request shape."""
    out: dict[str, Any] = {"role": message.role, "content": message.text}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


def chat_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


class GatewayChat:
    """The model behind a seat, reached with the OpenAI SDK.

    A turn rides out an outage of the gateway or its engine: an unreachable gateway, a 5xx, or a 503 while no
    engine serves (honouring Retry-After) are retried with backoff until `outage_window_s` has passed since
    the first failure, then the last error propagates. A repeated request is safe: the gateway answers a turn
    it already recorded from the ledger."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        max_retries: int = 2,
        timeout_s: float = 600,
        outage_window_s: float = 600,
        http_client: openai.DefaultAsyncHttpxClient | None = None,
        on_wait: Callable[[str], None] = lambda why: None,
    ) -> None:
        import openai

        self.outage_window_s = outage_window_s
        self._on_wait = on_wait

        # A runner passes one shared HTTP client: a new one per episode costs a TLS context and a connection
        # pool.
        self._owns_http = http_client is None
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=max_retries,
            timeout=timeout_s,
            http_client=http_client,
        )

    async def reply(self, messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
        request: dict[str, Any] = {"model": "default", "messages": [chat_message(m) for m in messages]}
        if tools:
            request["tools"] = [chat_tool(t) for t in tools]
        response = await self._outlasting(lambda: self._client.chat.completions.create(**request))
        choice = response.choices[0].message
        calls = tuple(
            ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments or "{}")
            for call in choice.tool_calls or []
            if call.type == "function"
        )
        return Message(role="assistant", text=choice.content or "", tool_calls=calls)

    async def _outlasting[T](self, call: Callable[[], Awaitable[T]]) -> T:
        import openai

        deadline: float | None = None
        backoff = 0.5
        while True:
            try:
                return await call()
            except (openai.APIConnectionError, openai.InternalServerError) as error:
                # APIConnectionError covers refused connections and timeouts; InternalServerError every 5xx.
                now = time.monotonic()
                deadline = deadline or now + self.outage_window_s
                if now + backoff > deadline:
                    raise
                self._on_wait(f"{type(error).__name__}: {error}")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def close(self) -> None:
        if self._owns_http:
            await self._client.close()


def checked_reward(end: End) -> float:
    try:
        reward = float(end.reward)
    except (TypeError, ValueError):
        raise InvalidReward(f"the task's reward {end.reward!r} is not a number") from None
    if not math.isfinite(reward):
        raise InvalidReward(f"the task's reward {reward} is not a finite number")
    return reward


async def play(
    task: Task,
    context: RunContext,
    model: ChatModel,
    *,
    max_turns: int,
    on_turn: Callable[[int], None] = lambda turn: None,
) -> LoopOutcome:
    observation: Observation = await _task_step(task.start(context), "start")
    messages = list(observation.messages())
    tools = observation.tools
    turns = 0
    while not isinstance(observation, End):
        if turns >= max_turns:
            return LoopOutcome(0.0, turns, truncated=True)
        reply = await model.reply(messages, tools)
        turns += 1
        on_turn(turns)
        messages.append(reply)
        observation = await _task_step(task.respond(context, reply), "respond")
        if not isinstance(observation, End):
            messages.extend(observation.messages())
            tools = observation.tools or tools
    return LoopOutcome(checked_reward(observation), turns, metrics=dict(observation.metrics))
