"""The built-in agent loop: a `Task` talks to the model through the gateway, turn by turn, until it ends.

Contract:
- The conversation is the Task's observations and the model's replies, in order; each request sends all of it
  (with the tools of the latest observation) to the seat's OpenAI-compatible base URL. The gateway turns that
  into token-exact segments and records each turn.
- A deterministic Task replays: a retried attempt sends the same requests, the gateway answers them from the
  recorded turns, and sampling continues where the first attempt stopped.
- The loop ends at the Task's `End` (its reward) or after `max_turns` model calls (reward 0, `truncated`).
- A `BadToolCall` raised by `respond` is the policy's mistake (rollout.harness): its message is each of the
  reply's tool calls' result (or the next user message) and the episode goes on.
- Each call into the Task (`start`, `respond`) runs under `turn_timeout_s`: one that raises otherwise or runs
  past it is a `TaskFailed` (its `failure` says which method, why, and where in the environment's code); a
  reward that is not a finite number is an `InvalidReward`. A request the gateway refuses as malformed or too
  long (400, 403, 404, 413, 422: a retry would send it again) is a `RequestRefused`, naming the Task method
  whose observation made it. A 410 (the seat's run was stopped, or its episode ended) is a `SeatClosed`. All
  four are `EpisodeFault`s: deterministic, never retried. Other model errors (an outage that outlasted
  `outage_window_s`) propagate as they are, to be retried. A Task that blocks the event loop (a synchronous
  sleep) cannot be timed out here: the activity then stops heartbeating and Temporal notices. The
  environment's synchronous code (a task source's draw, `trains`, `scripted_reply`) runs on a thread of its
  own (`in_thread`), so it is bounded the same way.
- `on_turn` is called after every model reply (the activity heartbeats there).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import openai

from rollout.contracts import Message, ToolCall, ToolSpec
from rollout.environment import TURN_TIMEOUT_S
from rollout.harness import BadToolCall, End, Observation, RunContext, Task
from rollout.run.failures import (
    INVALID_REWARD,
    REQUEST_REFUSED,
    SEAT_CLOSED,
    TASK_FAILED,
    TASK_TIMED_OUT,
    Failure,
    failure_in,
    one_line,
)


class EpisodeFault(Exception):
    """The episode failed in a way a retry would repeat; `failure` says how, in the environment's terms."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.summary)
        self.failure = failure


class TaskFailed(EpisodeFault):
    """The environment's code raised, or ran past its time limit."""


class InvalidReward(EpisodeFault):
    """A Task ended with a reward that is not a finite number."""


class RequestRefused(EpisodeFault):
    """The gateway refused the request the conversation made (a retry would make it again)."""


class SeatClosed(EpisodeFault):
    """The gateway takes no more turns for the seat: its run was stopped (or its episode had ended)."""


REFUSED_STATUSES = (400, 403, 404, 413, 422)
CLOSED_STATUS = 410


def defined_at(method: object) -> str | None:
    """`file:line` where a Task method is defined (the folder above its package's), if Python knows."""
    code = getattr(method, "__code__", None)
    if code is None:
        return None
    path = Path(code.co_filename)
    return f"{path.parent.name}/{path.name}:{code.co_firstlineno}"


async def task_call[T](
    step: Awaitable[T], what: str, package: str, limit_s: float, method: object = None
) -> T:
    """Await one call into the environment's code (`what`: `respond`; `method`, the function it runs, names
    the place of a timeout), bounded by `limit_s`."""
    bound = asyncio.timeout(limit_s)
    try:
        async with bound:
            return await step
    except TimeoutError as error:
        if not bound.expired():
            raise TaskFailed(failure_in(error, TASK_FAILED, what, package)) from error
        reason = f"{what} did not return within {limit_s:g} s (Environment.turn_timeout_s)"
        raise TaskFailed(Failure(TASK_TIMED_OUT, reason, defined_at(method))) from None
    except EpisodeFault:
        raise
    except Exception as error:
        raise TaskFailed(failure_in(error, TASK_FAILED, what, package)) from error


async def in_thread[T](call: Callable[[], T]) -> T:
    """`call()` (the environment's synchronous code: a task source's draw, `trains`, `scripted_reply`) on a
    thread of its own, so a call that never returns can be given up on (`task_call`) without blocking the
    event loop. The thread is a daemon: one still stuck when the process ends does not hold it up."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(cast(T, result))

    def run() -> None:
        try:
            result, error = call(), None
        except BaseException as raised:
            result, error = None, raised
        with contextlib.suppress(RuntimeError):  # the loop closed while this call was stuck
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, daemon=True, name="rollout-environment-call").start()
    return await done


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


def checked_reward(end: End, where: str | None = None) -> float:
    try:
        reward = float(end.reward)
    except (TypeError, ValueError):
        raise InvalidReward(
            Failure(INVALID_REWARD, f"the task's reward {end.reward!r} is not a number", where)
        ) from None
    if not math.isfinite(reward):
        raise InvalidReward(
            Failure(INVALID_REWARD, f"the task's reward {reward} is not a finite number", where)
        )
    return reward


def _refused(error: Exception, method: object) -> EpisodeFault | None:
    """The gateway's refusal of a request, as the episode's failure (None for an error a retry may fix)."""
    import openai

    if not isinstance(error, openai.APIStatusError):
        return None
    body = error.body if isinstance(error.body, dict) else {}
    said = cast(dict[str, Any], body).get("message") or error.message
    if error.status_code == CLOSED_STATUS:
        return SeatClosed(Failure(SEAT_CLOSED, one_line(f"the gateway takes no more turns: {said}")))
    if error.status_code not in REFUSED_STATUSES:
        return None
    reason = one_line(f"the gateway refused the conversation's request ({error.status_code}): {said}")
    return RequestRefused(Failure(REQUEST_REFUSED, reason, defined_at(method)))


async def _respond(task: Task, context: RunContext, reply: Message) -> Observation:
    """The task's answer to `reply`; a `BadToolCall` it raised (the policy's mistake) is told to the policy as
    each tool call's result, and the episode goes on."""
    try:
        return await task.respond(context, reply)
    except BadToolCall as error:
        told = f"error: {error}"
        if not reply.tool_calls:
            return Observation(told)
        return Observation(
            tuple(Message(role="tool", text=told, tool_call_id=c.id) for c in reply.tool_calls)
        )


async def play(
    task: Task,
    context: RunContext,
    model: ChatModel,
    *,
    max_turns: int,
    turn_timeout_s: float = TURN_TIMEOUT_S,
    on_turn: Callable[[int], None] = lambda turn: None,
) -> LoopOutcome:
    package = type(task).__module__
    observation: Observation = await task_call(
        task.start(context), "start", package, turn_timeout_s, type(task).start
    )
    came_from: object = type(task).start  # the method whose observation the next request carries
    messages = list(observation.messages())
    tools = observation.tools
    turns = 0
    while not isinstance(observation, End):
        if turns >= max_turns:
            return LoopOutcome(0.0, turns, truncated=True)
        try:
            reply = await model.reply(messages, tools)
        except Exception as error:
            if (refused := _refused(error, came_from)) is not None:
                raise refused from error
            raise
        turns += 1
        on_turn(turns)
        messages.append(reply)
        observation = await task_call(
            _respond(task, context, reply), "respond", package, turn_timeout_s, type(task).respond
        )
        came_from = type(task).respond
        if not isinstance(observation, End):
            messages.extend(observation.messages())
            tools = observation.tools or tools
    return LoopOutcome(
        checked_reward(observation, defined_at(came_from)), turns, metrics=dict(observation.metrics)
    )
