"""A real gateway (or any ASGI app) for tests: uvicorn serving it on a free port, inside the test session's
event loop; the scripted tool loop its engine answers with, and the turns a seat recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from rollout.config import RoutingSettings
from rollout.contracts import Message, ToolCall
from rollout.engines.external import ExternalModel
from rollout.engines.protocol import Engine
from rollout.gateway.admission import Admission, EngineSlot
from rollout.gateway.app import MAX_REQUEST_BYTES, build_app
from rollout.gateway.operator import Operator
from rollout.gateway.service import Gateway
from rollout.ledger import Kind, Ledger
from rollout.ledger.streams import seat_stream
from rollout.net import serving
from rollout.rendering import ModelRenderer

# The tool `tool_loop_script` calls, as an OpenAI Chat request offers it.
BASH: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


async def turns(ledger: Ledger, seat_id: str) -> list[dict[str, Any]]:
    """What a seat recorded, turn by turn (the payloads of its `TurnRecorded` events)."""
    return [dict(e.payload) for e in await ledger.read(seat_stream(seat_id)) if e.kind == Kind.TURN_RECORDED]


def tool_loop_script(prompt: str) -> Message:
    """Ask for `bash ls` until a tool result is in the prompt, then answer with what it said."""
    results = prompt.count("<tool_response>")
    if "bash" in prompt and results == 0:
        return Message.assistant(
            "", tool_calls=(ToolCall(id="call_1", name="bash", arguments='{"command": "ls"}'),)
        )
    if results:
        return Message.assistant(f"I ran {results} command(s). Done.")
    return Message.assistant("Hello from the script.")


@dataclass
class RunningGateway:
    url: str
    gateway: Gateway
    engine: Engine


@asynccontextmanager
async def serve_gateway(
    ledger: Ledger,
    renderer: ModelRenderer,
    engine: Engine,
    *,
    wait_s: float = 5.0,
    max_context: int = 4096,
    default_max_tokens: int = 4096,
    max_turns_in_flight_per_seat: int = 8,
    max_seats_kept: int = 4096,
    externals: dict[str, ExternalModel] | None = None,
    external_api_bases: Sequence[str] = (),
    max_request_bytes: int = MAX_REQUEST_BYTES,
    operator: Operator | None = None,
    host: str = "127.0.0.1",
    replicas: Sequence[Engine] = (),
    routing: RoutingSettings | None = None,
) -> AsyncIterator[RunningGateway]:
    """A gateway routing to `engine` (and `replicas`, engines of the same model beside it)."""
    slots = [EngineSlot(engine), *(EngineSlot(replica) for replica in replicas)]
    admission = Admission(ledger, slots, wait_s=wait_s, poll_s=0.05, routing=routing)
    gateway = Gateway(
        ledger,
        renderer,
        admission,
        max_context=max_context,
        default_max_tokens=default_max_tokens,
        max_turns_in_flight_per_seat=max_turns_in_flight_per_seat,
        max_seats_kept=max_seats_kept,
        externals=externals,
        external_api_bases=external_api_bases,
    )
    app = build_app(
        gateway, model_names=["base"], max_request_bytes=max_request_bytes, operator=operator, host=host
    )
    async with serving(app, host) as url:
        yield RunningGateway(url, gateway, engine)
