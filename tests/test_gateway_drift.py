"""No drift: over a 5-turn tool conversation with a real model, every prompt the engine saw extends the
previous prompt and sampled ids verbatim, and the ledger's segment rebuilds exactly those ids."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest

from rollout.engines.local import LocalEngine
from rollout.engines.models import SMOLLM2, resolve
from rollout.engines.protocol import SampleRequest, SampleResult
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Kind, Ledger
from rollout.ledger.streams import seat_stream
from rollout.rendering import ModelRenderer
from tests.gatewayutil import serve_gateway


class Watched(LocalEngine):
    """The local engine, noting every prompt it is asked to continue."""

    def __init__(self, path: str) -> None:
        super().__init__(path, device="cpu")
        self.prompts: list[tuple[int, ...]] = []

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.prompts.append(request.prompt_ids)
        return await super().sample(request)


@pytest.fixture(scope="module")
def smollm2(models_dir: Any) -> str:
    return resolve(SMOLLM2, models_dir)


async def test_five_turn_tool_conversation_has_no_drift(ledger: Ledger, smollm2: str, tmp_path: Any) -> None:
    engine = Watched(smollm2)
    renderer = ModelRenderer(engine.tokenizer, "chatml")
    seat_id = f"drift-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(ledger, load_secret(tmp_path / "secret"), seat_id=seat_id, agent="solver")
    tools: Any = [
        {
            "type": "function",
            "function": {
                "name": "calc",
                "description": "Evaluate arithmetic",
                "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
            },
        }
    ]
    async with serve_gateway(ledger, renderer, engine) as running:
        client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="x", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "What is 12 * 7? Use the calc tool."}]
        for turn in range(5):
            reply = await client.chat.completions.create(
                model="base", messages=messages, tools=tools, max_tokens=24, temperature=1.0, seed=turn
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if message.tool_calls:
                messages += [
                    {"role": "tool", "tool_call_id": c.id, "content": "84"} for c in message.tool_calls
                ]
            else:
                messages.append({"role": "user", "content": f"Check it once more ({turn})."})

    records = [e.payload for e in await ledger.read(seat_stream(seat_id)) if e.kind == Kind.TURN_RECORDED]
    assert len(records) == 5 and len(engine.prompts) == 5
    assert len({r["segment_id"] for r in records}) == 1, "five turns of one conversation are one segment"
    sequence: list[int] = []
    for k, record in enumerate(records):
        prompt = sequence[: record["prompt_prefix_len"]] + list(record["prompt_ids_delta"])
        assert tuple(prompt) == engine.prompts[k], (
            f"turn {k}: the record must rebuild the prompt the engine saw"
        )
        if k:
            previous = list(engine.prompts[k - 1]) + list(records[k - 1]["completion_ids"])
            assert prompt[: len(previous)] == previous, f"turn {k} re-tokenised earlier ids"
        assert len(record["completion_ids"]) == len(record["completion_logprobs"]) > 0
        sequence = prompt + list(record["completion_ids"])
