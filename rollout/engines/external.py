"""External models: a model the platform does not train (a frontier model as an opponent or a judge), reached
through LiteLLM.

Contract: `ExternalModel.complete` sends canonical messages and tools, in OpenAI's shape, to any model LiteLLM
routes to and returns the canonical assistant message with token counts; a provider that cannot be reached,
answers 5xx or limits the rate is `EngineUnavailable`. LiteLLM is kept from fetching its price list online.
Nothing here deals in token ids: the gateway records such turns as text, marked never to be trained.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rollout.contracts import Message, SamplingParams, ToolCall, ToolSpec
from rollout.engines.protocol import EngineUnavailable


@dataclass(frozen=True)
class ExternalReply:
    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def _openai_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": message.role if message.role != "developer" else "system",
        "content": message.text,
    }
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


@dataclass(frozen=True)
class ExternalModel:
    """`model` in LiteLLM's naming (`anthropic/claude-...`, `openai/gpt-...`, `openai/NAME` with
    `api_base`)."""

    model: str
    api_base: str | None = None
    api_key: str | None = None
    timeout_s: float = 300

    @staticmethod
    def from_spec(spec: str) -> ExternalModel:
        """`MODEL` or `MODEL@API_BASE` (an OpenAI-compatible server: `openai/NAME@http://host:port/v1`). The
        key is LiteLLM's to find in the environment (ANTHROPIC_API_KEY, OPENAI_API_KEY, ...); a server of your
        own named by API_BASE with no key set gets a placeholder, as such servers ask for none."""
        name, _, api_base = spec.partition("@")
        if not name:
            raise ValueError(f"external model {spec!r}: write MODEL or MODEL@API_BASE")
        return ExternalModel(name, api_base=api_base or None)

    async def complete(
        self, messages: list[Message], tools: list[ToolSpec], params: SamplingParams
    ) -> ExternalReply:
        # LiteLLM fetches its model price list from GitHub on import unless told not to: a gateway sends
        # nothing beyond what it was configured to reach.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            import litellm  # heavy: imported only where an external model is used
        except ImportError:
            raise EngineUnavailable("external models need LiteLLM: `uv sync --extra external`") from None

        request: dict[str, Any] = {
            "model": self.model,
            "messages": [_openai_message(m) for m in messages],
            "temperature": params.temperature,
            "top_p": params.top_p,
            "timeout": self.timeout_s,
        }
        if params.max_tokens:
            request["max_tokens"] = params.max_tokens
        if params.stop:
            request["stop"] = list(params.stop)
        if tools:
            request["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        if self.api_base:
            request["api_base"] = self.api_base
        if self.api_key:
            request["api_key"] = self.api_key
        elif self.api_base and self.model.startswith("openai/") and not os.environ.get("OPENAI_API_KEY"):
            request["api_key"] = "none"  # a server of one's own asks for no key; LiteLLM insists on one
        try:
            response: Any = await litellm.acompletion(**request)
        except (
            litellm.exceptions.APIConnectionError,
            litellm.exceptions.InternalServerError,  # a provider's 5xx, or a connection it could not make
            litellm.exceptions.ServiceUnavailableError,
            litellm.exceptions.Timeout,
            litellm.exceptions.RateLimitError,
        ) as error:
            raise EngineUnavailable(f"external model {self.model} is unavailable: {error}") from error
        choice = response.choices[0]
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
            for c in (choice.message.tool_calls or [])
        )
        reasoning = getattr(choice.message, "reasoning_content", None)
        message = Message(
            role="assistant",
            text=choice.message.content or "",
            tool_calls=calls,
            reasoning=reasoning if isinstance(reasoning, str) else None,
        )
        usage = getattr(response, "usage", None)
        return ExternalReply(
            message=message,
            finish_reason="tool_calls"
            if calls
            else ("length" if choice.finish_reason == "length" else "stop"),
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        )
