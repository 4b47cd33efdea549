"""Where the gateway sends a turn: a seat bound to a model the platform does not train goes through LiteLLM
(recorded as text only) at an API base the gateway was configured with, and an engine is reached at the URL of
an ack only when the ack is signed."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import uvicorn
from transformers import AutoTokenizer

from benchmarks.scripted_backend import REPLY, build
from rollout.engines.external import ExternalModel
from rollout.engines.scripted import ScriptedEngine
from rollout.engines.vllm_client import VLLMEngine
from rollout.gateway.routing import Routes
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import SERVING_ACKS, run_stream, seat_stream
from rollout.net import free_port
from rollout.records.serving import Served, ServingAck
from rollout.rendering import ModelRenderer
from rollout.run.settings import RunSettings
from rollout.serving.keys import engine_api_key
from tests.gatewayutil import serve_gateway, tool_loop_script


async def test_an_external_judge_answers_and_is_never_trained(
    ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    port = free_port()
    backend = uvicorn.Server(
        uvicorn.Config(build([1, 2, 3]), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(backend.serve())
    for _ in range(500):
        if backend.started:
            break
        await asyncio.sleep(0.02)
    renderer = ModelRenderer(AutoTokenizer.from_pretrained(tiny_qwen3), "qwen3")
    judge = ExternalModel("openai/judge-model", api_base=f"http://127.0.0.1:{port}/v1", api_key="none")
    seat_id = f"judge-{uuid.uuid4().hex[:8]}"
    _, token = await open_seat(
        ledger, load_secret(tmp_path / "s"), seat_id=seat_id, agent="judge", policy="judge"
    )
    try:
        async with serve_gateway(
            ledger, renderer, ScriptedEngine(renderer, tool_loop_script), externals={"judge": judge}
        ) as running:
            chat = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="x", max_retries=0)
            messages: Any = [{"role": "user", "content": "Which answer is better, A or B?"}]
            first = await chat.chat.completions.create(model="judge", messages=messages)
            again = await chat.chat.completions.create(model="judge", messages=messages)  # a retry replays
            claude = anthropic.AsyncAnthropic(base_url=f"{running.url}/s/{token}", api_key="x", max_retries=0)
            other = await claude.messages.create(
                model="judge", max_tokens=50, messages=[{"role": "user", "content": "And now, C or D?"}]
            )
    finally:
        backend.should_exit = True
        await serving
    assert first.choices[0].message.content == again.choices[0].message.content == REPLY
    assert [b.text for b in other.content if b.type == "text"] == [REPLY]
    records = [e.payload for e in await ledger.read(seat_stream(seat_id)) if e.kind == Kind.TURN_RECORDED]
    assert len(records) == 2, "the retry was answered from the record"
    assert all(r["external"] and r["trainable"] is False and "completion_ids" not in r for r in records)
    assert records[0]["model"] == "openai/judge-model"


@pytest.mark.parametrize("named", ["openai/gpt-x@{base}", "huggingface/{base}"])
async def test_a_run_cannot_send_its_turns_to_an_api_base_the_gateway_was_not_configured_with(
    ledger: Ledger, tiny_qwen3: str, tmp_path: Path, named: str
) -> None:
    """Whoever writes a run's settings chooses its `external_model/POLICY`; where prompts (and the provider
    key LiteLLM adds) may go is the gateway's configuration, whether the run names the base after `@` or in
    the model's name (LiteLLM's huggingface provider posts to a URL there)."""
    run = f"ext-{uuid.uuid4().hex[:8]}"
    elsewhere = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    settings = RunSettings(external_models={"judge": named.format(base=elsewhere)}).recorded()
    await ledger.append_one(
        run_stream(run),
        NewEvent("created", Kind.RUN_CREATED, {"run": run, "environment": "e", "settings": settings}),
    )
    _, token = await open_seat(
        ledger,
        load_secret(tmp_path / "s"),
        seat_id=f"{run}/judge",
        agent="judge",
        policy=f"{run}/judge",
        run=run,
    )
    renderer = ModelRenderer(AutoTokenizer.from_pretrained(tiny_qwen3), "qwen3")
    body = {"model": "judge", "messages": [{"role": "user", "content": "A or B?"}]}
    async with (
        serve_gateway(ledger, renderer, ScriptedEngine(renderer, tool_loop_script)) as running,
        httpx.AsyncClient(base_url=running.url, timeout=60) as http,
    ):
        refused = await http.post(f"/s/{token}/v1/chat/completions", json=body)
    assert refused.status_code == 403, refused.text
    assert "services.gateway.external_api_bases" in refused.json()["error"]["message"]
    async with (
        serve_gateway(
            ledger, renderer, ScriptedEngine(renderer, tool_loop_script), external_api_bases=[elsewhere + "/"]
        ) as running,
        httpx.AsyncClient(base_url=running.url, timeout=60) as http,
    ):
        allowed = await http.post(f"/s/{token}/v1/chat/completions", json=body)
    assert allowed.status_code != 403, "a configured base is tried (and nothing answers there)"


async def test_a_forged_serving_ack_brings_no_prompt_to_the_url_it_names(ledger: Ledger) -> None:
    """Any writer of the ledger can append an ack; only one signed with the engines' key names a URL the
    gateway sends turns to."""
    key, run = secrets.token_bytes(32), uuid.uuid4().hex[:8]
    served = (Served(policy="p", checkpoint="p-step000001", version=1),)

    def ack(url: str) -> ServingAck:
        return ServingAck(engine=f"e-{run}", url=url, incarnation=run, n=1, serving=served)

    rogue, wrong_key, real = (f"http://127.0.0.1:9/{name}-{run}" for name in ("rogue", "wrong", "real"))
    for sent in (ack(rogue), ack(wrong_key).signed(secrets.token_bytes(32)), ack(real).signed(key)):
        await ledger.append_one(SERVING_ACKS, NewEvent(f"{sent.url}/1", Kind.SERVING_ACK, sent.to_payload()))
    api_key = engine_api_key(key)
    routes = Routes(
        ledger, [], connect=lambda url, name: VLLMEngine(url, api_key=api_key, name=name), ack_key=key
    )
    reached = {getattr(slot.engine, "base_url", None) for slot in await routes.slots(fresh=True)}
    assert real in reached and rogue not in reached and wrong_key not in reached
    unkeyed = Routes(ledger, [], connect=lambda url, name: VLLMEngine(url, api_key=api_key, name=name))
    assert not await unkeyed.slots(fresh=True), "without a key, no engine is known by its ack alone"
    # A later unsigned ack for the real engine's URL (serving nothing), and a payload that is no ack at all,
    # neither hide the engine's signed state nor stop the gateway reading acks.
    shadow = replace(ack(real), n=2, serving=())
    await ledger.append_one(SERVING_ACKS, NewEvent(f"{real}/2", Kind.SERVING_ACK, shadow.to_payload()))
    await ledger.append_one(SERVING_ACKS, NewEvent(f"{real}/junk", Kind.SERVING_ACK, {"engine": ["x"]}))
    served_by_real = {
        slot.checkpoint
        for slot in await routes.slots(fresh=True)
        if getattr(slot.engine, "base_url", None) == real
    }
    assert "p-step000001" in served_by_real, served_by_real
