"""The local engine over real HTTP, driven by the same client that drives vLLM; and refusing, on every route
but /health, whoever does not hold the engine API key."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch
import uvicorn

from rollout.engines.local import LocalEngine
from rollout.engines.protocol import CheckpointNotServed, EngineError, EngineUnavailable, SampleRequest
from rollout.engines.vllm_client import VLLMEngine
from rollout.engines.vllm_server import build_app
from rollout.net import free_port
from rollout.serving.keys import engine_api_key

ENGINE_KEY = secrets.token_hex(32).encode()  # as DATA_DIR/engine.key holds it
API_KEY = engine_api_key(ENGINE_KEY)
KEYED = {"authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def engine(tiny_qwen3: str) -> LocalEngine:
    return LocalEngine(tiny_qwen3, device="cpu", batch_window_s=0.05)


@pytest.fixture(scope="module")
def server_url(engine: LocalEngine) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(engine, api_key=API_KEY), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
async def client(server_url: str) -> AsyncIterator[VLLMEngine]:
    engine_client = VLLMEngine(server_url, api_key=API_KEY, name="local")
    yield engine_client
    await engine_client.close()


def prompt(engine: LocalEngine, text: str) -> tuple[int, ...]:
    rendered = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return tuple(rendered["input_ids"])


def reference_logprobs(
    engine: LocalEngine, prompt_ids: tuple[int, ...], completion: tuple[int, ...]
) -> list[float]:
    with torch.no_grad():
        logits = engine.model(torch.tensor([list(prompt_ids + completion)])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[len(prompt_ids) - 1 + i, token].item() for i, token in enumerate(completion)]


async def test_samples_come_back_with_exact_ids_and_behaviour_logprobs(
    engine: LocalEngine, client: VLLMEngine
) -> None:
    ids = prompt(engine, "count to three")
    result = await client.sample(SampleRequest(ids, max_tokens=12, temperature=1.0, seed=7))
    assert len(result.completion_ids) == len(result.logprobs) > 0
    assert result.model == "base"
    expected = reference_logprobs(engine, ids, result.completion_ids)
    assert max(abs(a - b) for a, b in zip(expected, result.logprobs, strict=True)) < 1e-4


async def test_concurrent_requests_share_batches_and_seeds_hold(
    engine: LocalEngine, client: VLLMEngine
) -> None:
    ids = prompt(engine, "hello")
    before = engine.batches_run
    results = await asyncio.gather(
        *[client.sample(SampleRequest(ids, max_tokens=8, temperature=1.0, seed=s)) for s in range(6)]
    )
    assert engine.batches_run - before < 6, "six concurrent requests must not run one by one"
    alone = await client.sample(SampleRequest(ids, max_tokens=8, temperature=1.0, seed=4))
    assert alone.completion_ids == results[4].completion_ids  # a seed draws the same tokens in any batch


async def test_greedy_stops_at_max_tokens(engine: LocalEngine, client: VLLMEngine) -> None:
    result = await client.sample(SampleRequest(prompt(engine, "hi"), max_tokens=3, temperature=0.0))
    assert len(result.completion_ids) <= 3
    if len(result.completion_ids) == 3:
        assert result.finish_reason in ("length", "stop")


async def test_lora_checkpoints_load_at_runtime_and_serve_by_name(
    engine: LocalEngine, client: VLLMEngine, tmp_path: Path
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(engine.model_path)
    adapted = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    adapted.save_pretrained(str(tmp_path / "ckpt-1"))
    from rollout.engines.protocol import CheckpointRef

    await client.load(CheckpointRef("ckpt-1", str(tmp_path / "ckpt-1")))
    assert await client.models() == ["base", "ckpt-1"]
    ids = prompt(engine, "hi")
    on_base = await client.sample(SampleRequest(ids, max_tokens=4, temperature=0.0, model="base"))
    on_lora = await client.sample(SampleRequest(ids, max_tokens=4, temperature=0.0, model="ckpt-1"))
    assert on_base.logprobs != on_lora.logprobs
    again = await client.sample(SampleRequest(ids, max_tokens=4, temperature=0.0, model="base"))
    assert again.logprobs == pytest.approx(on_base.logprobs, abs=1e-5)  # the base is unchanged by the adapter
    # Not served (yet, or any more): an availability problem the gateway waits out, not a refusal.
    with pytest.raises(CheckpointNotServed, match="not loaded"):
        await client.sample(SampleRequest(ids, max_tokens=4, model="ckpt-9"))
    await client.unload("ckpt-1")
    assert await client.models() == ["base"]


async def test_full_weight_checkpoints_load_at_runtime_and_serve_by_name(
    engine: LocalEngine, client: VLLMEngine, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rollout.engines.protocol import CheckpointRef

    trained = AutoModelForCausalLM.from_pretrained(engine.model_path)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)  # a step's worth of change, on every weight
    trained.save_pretrained(str(tmp_path / "full-1"))
    await client.load(CheckpointRef("full-1", str(tmp_path / "full-1")))
    assert await client.models() == ["base", "full-1"]
    ids = prompt(engine, "hi")
    on_base = await client.sample(SampleRequest(ids, max_tokens=4, temperature=0.0, model="base"))
    on_full = await client.sample(SampleRequest(ids, max_tokens=4, temperature=0.0, model="full-1"))
    assert on_base.logprobs != on_full.logprobs
    again = await client.sample(SampleRequest(ids, max_tokens=4, temperature=0.0, model="base"))
    assert again.logprobs == pytest.approx(on_base.logprobs, abs=1e-5)  # the base is its own model still
    # Through the server, as a follower loads: the engine's lock belongs to the server's event loop.
    with pytest.raises(EngineError, match="neither a LoRA adapter"):
        await client.load(CheckpointRef("empty", str(tmp_path)))
    await client.unload("full-1")
    assert await client.models() == ["base"]


async def test_an_asleep_engine_refuses_with_503_until_woken(engine: LocalEngine, client: VLLMEngine) -> None:
    await client.sleep()
    with pytest.raises(EngineUnavailable):
        await client.sample(SampleRequest(prompt(engine, "hi"), max_tokens=2))
    await client.wake()
    assert (await client.sample(SampleRequest(prompt(engine, "hi"), max_tokens=2))).completion_ids


async def test_requests_past_the_queue_bound_are_refused_as_unavailable(engine: LocalEngine) -> None:
    """A flood queues no unbounded work: past `max_queued` waiting, a request is refused (a retryable 503)."""
    engine.max_queued, bound = 2, engine.max_queued
    try:
        request = SampleRequest(prompt(engine, "hi"), max_tokens=2)
        outcomes = await asyncio.gather(*[engine.sample(request) for _ in range(5)], return_exceptions=True)
    finally:
        engine.max_queued = bound
    assert sum(isinstance(o, EngineUnavailable) for o in outcomes) == 3
    assert (await engine.sample(request)).completion_ids, "the queue drained: requests are taken again"


async def test_bad_requests_get_vllm_shaped_errors(server_url: str) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=server_url, headers=KEYED) as http:
        response = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": "many"})
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "'max_tokens' has the wrong type"
        response = await http.post(
            "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert response.status_code == 400
        # A load or unload whose body is no JSON object with its names: a 400 in vLLM's shape, never a 500.
        for route, body in [
            ("/v1/load_lora_adapter", b"{not json"),
            ("/v1/load_lora_adapter", b"[1, 2]"),
            ("/v1/load_lora_adapter", b""),
            ("/v1/unload_lora_adapter", b"{not json"),
            ("/v1/unload_lora_adapter", b'"ckpt"'),
            ("/v1/unload_lora_adapter", b"{}"),
        ]:
            response = await http.post(route, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400, (route, body, response.text)
            assert set(response.json()["error"]) == {"message", "type", "code"}, response.text
        # Its admin routes refuse what a web page can send: a foreign Host (DNS rebinding), a form post, a
        # body-less POST from another origin; what it does not serve is answered in the same shape.
        load = {"lora_name": "x", "lora_path": "/nowhere"}
        refusals = [
            (421, await http.post("/v1/load_lora_adapter", json=load, headers={"host": "evil.example"})),
            (415, await http.post("/v1/load_lora_adapter", data=load)),
            (
                415,
                await http.post(
                    "/v1/unload_lora_adapter", content=b"{}", headers={"content-type": "text/plain"}
                ),
            ),
            (415, await http.post("/sleep", headers={"origin": "http://evil.example"})),
            (404, await http.post("/collective_rpc", json={})),
            (405, await http.get("/wake_up")),
        ]
        for status, refused in refusals:
            assert refused.status_code == status, refused.text
            assert set(refused.json()["error"]) == {"message", "type", "code"}, refused.text
        assert not (await http.get("/is_sleeping")).json()["is_sleeping"]


async def test_an_unreachable_engine_is_unavailable_not_an_error() -> None:
    unreachable = VLLMEngine(f"http://127.0.0.1:{free_port()}", api_key=API_KEY)
    with pytest.raises(EngineUnavailable):
        await unreachable.sample(SampleRequest((1, 2, 3), max_tokens=2))
    assert await unreachable.health() is False
    await unreachable.close()


async def test_a_stream_hands_out_what_sample_returns_token_by_token(
    engine: LocalEngine, client: VLLMEngine
) -> None:
    ids = prompt(engine, "count to three")
    request = SampleRequest(ids, max_tokens=12, temperature=1.0, seed=11)
    whole = await engine.sample(request)
    for streamer in (engine, client):  # in process, and over vLLM's streaming dialect
        chunks = [chunk async for chunk in streamer.stream(request)]
        assert len(chunks) == len(whole.completion_ids), "one chunk per token"
        assert all(c.finish_reason is None for c in chunks[:-1])
        assert chunks[-1].finish_reason == whole.finish_reason and chunks[-1].model == "base"
        assert tuple(t for c in chunks for t in c.ids) == whole.completion_ids
        streamed = [x for c in chunks for x in c.logprobs]
        assert streamed == pytest.approx(list(whole.logprobs), abs=1e-5)  # the same behaviour logprobs


async def test_a_stream_closed_early_stops_its_row_of_the_batch(engine: LocalEngine) -> None:
    from rollout.engines.sampling import sample_batch

    heard: list[int] = []

    def on_token(row: int, token: int, logprob: float, finish: object) -> bool:
        heard.append(token)
        return len(heard) < 3  # the reader leaves after the third token

    request = SampleRequest(prompt(engine, "hi"), max_tokens=50, temperature=1.0, seed=3)
    [result] = await asyncio.to_thread(sample_batch, engine.model, [request], engine.pad_id, set(), on_token)
    assert len(result.ids) == 3 and list(result.ids) == heard
    stream = engine.stream(request)
    first = await anext(stream)
    await stream.aclose()
    assert len(first.ids) == 1
    assert (
        await engine.sample(SampleRequest(request.prompt_ids, max_tokens=2))
    ).completion_ids  # still serves


async def test_sampling_builds_no_autograd_graph(engine: LocalEngine) -> None:
    """Sampled with autograd on, every step's graph stays alive through the KV cache: one smoke eval grew the
    engine to 22 GB and starved Temporal of memory (issue 48)."""
    from rollout.engines.sampling import sample_batch

    graphs: list[bool] = []  # per forward pass: whether its logits carry an autograd graph
    hook = engine.model.register_forward_hook(
        lambda _, args, output: graphs.append(output.logits.requires_grad)
    )
    try:
        request = SampleRequest(prompt(engine, "count to ten"), max_tokens=6, temperature=1.0, seed=5)
        await asyncio.to_thread(sample_batch, engine.model, [request], engine.pad_id, set())
    finally:
        hook.remove()
    assert len(graphs) == 6 and not any(graphs)


async def test_a_finished_row_leaves_its_batch_and_its_caller_is_answered_then(engine: LocalEngine) -> None:
    from rollout.engines.sampling import sample_batch

    ids = prompt(engine, "tell me a story")
    long = SampleRequest(ids, max_tokens=40, temperature=1.0, seed=11)
    short = SampleRequest(ids, max_tokens=2, temperature=1.0, seed=12)
    rows: list[int] = []  # the batch size of every forward pass
    hook = engine.model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        together = await asyncio.to_thread(sample_batch, engine.model, [long, short], engine.pad_id, set())
        alone = await asyncio.to_thread(sample_batch, engine.model, [long], engine.pad_id, set())
    finally:
        hook.remove()
    assert len(together[1].ids) == 2 and len(together[0].ids) == 40
    assert rows[:2] == [2, 2] and set(rows[2:40]) == {1}, "the short row left after its last token"
    assert together[0].ids == alone[0].ids  # what stays in the batch draws what it would alone
    assert together[0].logprobs == pytest.approx(alone[0].logprobs, abs=1e-4)

    done: dict[str, float] = {}

    async def timed(name: str, request: SampleRequest) -> None:
        await engine.sample(request)
        done[name] = time.perf_counter()

    before = engine.batches_run
    await asyncio.gather(timed("long", long), timed("short", short))
    await asyncio.sleep(0.2)  # the batcher counts a batch once its last row is answered
    assert engine.batches_run - before == 1, "both shared one batch"
    assert done["short"] < done["long"], "the short request was answered when it finished, not with the batch"


async def test_every_route_but_health_refuses_whoever_lacks_the_engine_api_key(
    engine: LocalEngine, client: VLLMEngine, server_url: str, tmp_path: Path
) -> None:
    """Whoever reaches the port without the key (a process of another user, a page through a tunnel, an agent
    holding a seat token, a leaked ack-signing key) is refused before any route acts: it cannot swap the
    weights served under a checkpoint's name, unload them, pause the engine or put it to sleep, or sample."""
    import httpx
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rollout.engines.protocol import CheckpointRef
    from rollout.gateway.seats import seat_token

    def adapter(seed: int) -> str:
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(engine.model_path)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(base, config).save_pretrained(str(tmp_path / f"adapter-{seed}"))
        return str(tmp_path / f"adapter-{seed}")

    served, swapped = adapter(1), adapter(2)
    await client.load(CheckpointRef("ckpt-real", served))
    ids = prompt(engine, "hi")
    before = await client.sample(SampleRequest(ids, max_tokens=4, temperature=0.0, model="ckpt-real"))
    attackers = {
        "no key": {},
        "a wrong key": {"authorization": f"Bearer {engine_api_key(secrets.token_bytes(32))}"},
        "the key and more": {"authorization": f"Bearer {API_KEY}0"},
        "a seat token": {"authorization": f"Bearer {seat_token(secrets.token_bytes(32), 'seat/1')}"},
        "the ack-signing key": {"authorization": f"Bearer {ENGINE_KEY.decode()}"},
        "the key, not as a bearer": {"authorization": f"Basic {API_KEY}", "x-api-key": API_KEY},
    }
    completion = {"model": "ckpt-real", "prompt": list(ids), "max_tokens": 2}
    try:
        async with httpx.AsyncClient(base_url=server_url) as http:
            for who, headers in attackers.items():
                asked = [
                    await http.post(
                        "/v1/load_lora_adapter",
                        json={"lora_name": "ckpt-real", "lora_path": swapped},
                        headers=headers,
                    ),
                    await http.post(
                        "/v1/unload_lora_adapter", json={"lora_name": "ckpt-real"}, headers=headers
                    ),
                    await http.post("/v1/completions", json=completion, headers=headers),
                    await http.post("/sleep", params={"level": "1"}, headers=headers),
                    await http.post("/pause", headers=headers),
                    await http.post("/wake_up", headers=headers),
                    await http.post("/resume", headers=headers),
                    await http.get("/v1/models", headers=headers),
                    await http.get("/is_sleeping", headers=headers),
                    await http.get("/is_paused", headers=headers),
                    await http.post("/collective_rpc", json={}, headers=headers),  # served or not: untold
                ]
                for refused in asked:
                    assert refused.status_code == 401, (who, refused.request.url, refused.text)
                    assert refused.headers["www-authenticate"] == "Bearer"
                    error = refused.json()["error"]
                    assert (error["type"], error["code"]) == ("UnauthorizedError", 401), (who, error)
                    assert API_KEY not in refused.text
            assert (await http.get("/health")).status_code == 200, "a probe needs no key"
            # The same key, its scheme in another case: taken.
            lower = {"authorization": f"bearer {API_KEY}"}
            assert (await http.get("/is_sleeping", headers=lower)).json() == {"is_sleeping": False}
        # Nothing the attackers asked was done: the same adapter serves under its name, awake and unpaused.
        assert await client.models() == ["base", "ckpt-real"]
        after = await client.sample(SampleRequest(ids, max_tokens=4, temperature=0.0, model="ckpt-real"))
        assert after.completion_ids == before.completion_ids
        assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)
        # A client without the key is told why, as an engine error (not an engine that is down).
        keyless = VLLMEngine(server_url, api_key=None)
        try:
            with pytest.raises(EngineError, match="API key"):
                await keyless.load(CheckpointRef("ckpt-real", swapped))
        finally:
            await keyless.close()
    finally:
        await client.unload("ckpt-real")
    assert await client.models() == ["base"]


def test_an_engine_server_is_never_built_without_a_key(engine: LocalEngine) -> None:
    with pytest.raises(ValueError, match="API key"):
        build_app(engine, api_key="")


def test_only_a_plain_key_value_cache_lets_rows_leave() -> None:
    """A hybrid model's cache (Qwen3.5: linear-attention layers keep a recurrent state per row) keeps its
    finished rows, padded, rather than fail the batch or cut keys apart from state."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, LinearAttentionLayer

    from rollout.engines.sampling import _rows_can_leave  # pyright: ignore[reportPrivateUsage]

    plain, hybrid = DynamicCache(), DynamicCache()
    plain.layers[:] = [DynamicLayer(), DynamicLayer()]
    hybrid.layers[:] = [DynamicLayer(), LinearAttentionLayer()]
    assert _rows_can_leave(plain) and not _rows_can_leave(hybrid) and not _rows_can_leave(None)
