"""The local engine's prefix cache: a turn sampled on a cached prefix draws what the same turn computed fresh
draws, never reuses another checkpoint's states, and holds to its budget; the gateway's answers and records
say how many prompt tokens it held."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout.engines.local import LocalEngine
from rollout.engines.models import SMOLLM2, resolve
from rollout.engines.prefix_cache import PrefixCache, entry
from rollout.engines.protocol import CheckpointRef, SampleRequest, collected
from rollout.engines.sampling import Reuse, reuse_refused, sample_batch
from rollout.engines.vllm_client import VLLMEngine
from rollout.engines.vllm_server import build_app
from rollout.ledger import Ledger
from rollout.net import serving
from rollout.rendering import ModelRenderer
from tests.gatewayutil import serve_gateway, turns

API_KEY = "prefix-cache-test-key"
LOGPROB_TOLERANCE = 1e-4  # float32 on CPU: the cached and fresh paths sum the same terms in other orders


@pytest.fixture(scope="module")
def cached_engine(tiny_qwen3: str) -> LocalEngine:
    return LocalEngine(tiny_qwen3, device="cpu", batch_window_s=0.05)


@pytest.fixture(scope="module")
def fresh_engine(tiny_qwen3: str) -> LocalEngine:
    engine = LocalEngine(tiny_qwen3, device="cpu", batch_window_s=0.05, prefix_cache_mb=0)
    assert engine.prefix_cache is None and engine.prefix_cache_off == "services.engine.prefix_cache_mb=0"
    return engine


@pytest.fixture(scope="module")
async def cached_url(cached_engine: LocalEngine) -> AsyncIterator[str]:
    async with serving(build_app(cached_engine, api_key=API_KEY)) as url:
        yield url


@pytest.fixture
async def client(cached_url: str) -> AsyncIterator[VLLMEngine]:
    made = VLLMEngine(cached_url, api_key=API_KEY, name="local")
    yield made
    await made.close()


def user_turn(engine: LocalEngine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"))


def assert_same_draw(cached: Any, fresh: Any) -> None:
    assert cached.completion_ids == fresh.completion_ids
    assert cached.logprobs == pytest.approx(fresh.logprobs, abs=LOGPROB_TOLERANCE)
    assert cached.finish_reason == fresh.finish_reason


async def test_a_conversation_on_its_cached_prefix_draws_what_it_draws_fresh(
    cached_engine: LocalEngine, fresh_engine: LocalEngine, client: VLLMEngine
) -> None:
    conversation = user_turn(cached_engine, "a conversation that goes on for a while")
    streamed_some = False
    kept = 0  # the tokens of the conversation so far whose states the last turn left in the cache
    for turn in range(5):
        request = SampleRequest(conversation, max_tokens=24, temperature=1.0, seed=100 + turn)
        fresh = await fresh_engine.sample(request)
        if turn % 2:  # over HTTP, streamed: the cached count arrives in the usage chunk
            cached = collected([chunk async for chunk in client.stream(request)], "base")
            streamed_some = True
        else:
            cached = await client.sample(request)
        assert_same_draw(cached, fresh)
        assert fresh.cached_tokens == 0
        assert cached.cached_tokens == kept  # every token of the last turn but its last drawn one
        kept = len(conversation) + len(cached.completion_ids) - 1
        conversation = conversation + cached.completion_ids + user_turn(cached_engine, f"and then {turn}?")
    assert streamed_some


async def test_group_siblings_share_their_prompt_and_draw_what_they_draw_fresh(
    cached_engine: LocalEngine, fresh_engine: LocalEngine
) -> None:
    prompt = user_turn(cached_engine, "siblings " * 40)
    requests = [SampleRequest(prompt, max_tokens=16, temperature=1.0, seed=seed) for seed in range(6)]
    cached = await asyncio.gather(*(cached_engine.sample(r) for r in requests))
    fresh = await asyncio.gather(*(fresh_engine.sample(r) for r in requests))
    for one, other in zip(cached, fresh, strict=True):
        assert_same_draw(one, other)
        # The first of them too: the batch prefilled the prompt they share once, then each row from it.
        assert one.cached_tokens == len(prompt) - 1


def test_a_real_model_draws_the_same_on_a_cached_prefix(models_dir: Path) -> None:
    """SmolLM2's trained weights (peaked distributions), in one batch of rows with cached prefixes of
    different lengths beside a row with none."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve(SMOLLM2, models_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert reuse_refused(model) is None
    eos = {tokenizer.eos_token_id}

    def chat(text: str) -> tuple[int, ...]:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        return tuple(rendered["input_ids"])

    short, long = chat("Name a colour."), chat("Tell me, in a few words, what the sea looks like at night.")
    cache = PrefixCache(64 << 20)
    reuse = Reuse(cache, "base#0")
    first = sample_batch(model, [SampleRequest(long, max_tokens=12, seed=1)], 0, eos, reuse=reuse)[0]
    requests = [
        SampleRequest(long + first.ids + chat("And by day?"), max_tokens=12, seed=2),  # most of it cached
        SampleRequest(long[:-3] + chat("Shorter."), max_tokens=12, seed=3),  # part of it cached
        SampleRequest(short, max_tokens=12, seed=4),  # the template's opening, at most
    ]
    fresh = sample_batch(model, requests, 0, eos)
    cached = sample_batch(model, requests, 0, eos, reuse=reuse)
    assert cached[0].cached_tokens == len(long) + len(first.ids) - 1
    assert 0 < cached[1].cached_tokens < len(long)
    for one, other in zip(cached, fresh, strict=True):
        assert one.ids == other.ids
        assert one.logprobs == pytest.approx(other.logprobs, abs=LOGPROB_TOLERANCE)


async def test_a_new_checkpoint_never_reuses_another_checkpoints_states(
    cached_engine: LocalEngine, fresh_engine: LocalEngine, client: VLLMEngine, tmp_path: Path
) -> None:
    """Loads and samples go through the cached engine's server (its batches run on the server's loop)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    for name in ("v1", "v2"):
        adapted = get_peft_model(
            AutoModelForCausalLM.from_pretrained(cached_engine.model_path),
            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        )
        adapted.save_pretrained(str(tmp_path / name))
    for name, version in (("policy@1", "v1"), ("policy@2", "v2")):
        await client.load(CheckpointRef(name, str(tmp_path / version)))
        await fresh_engine.load(CheckpointRef(name, str(tmp_path / version)))
    try:
        prompt = user_turn(cached_engine, "a turn sampled on one checkpoint, then the next")
        on_v1 = await client.sample(SampleRequest(prompt, max_tokens=12, model="policy@1", seed=5))
        follow_up = prompt + on_v1.completion_ids + user_turn(cached_engine, "go on")
        again = await client.sample(SampleRequest(follow_up, max_tokens=4, model="policy@1"))
        assert again.cached_tokens > len(prompt)
        for model in ("policy@2", "base"):  # the same conversation's next turn on another checkpoint
            request = SampleRequest(follow_up, max_tokens=12, model=model, seed=6)
            on_other = await client.sample(request)
            # policy@2 has computed nothing yet; the base, other tests' chat-template openings at most.
            assert (
                on_other.cached_tokens == 0 if model == "policy@2" else on_other.cached_tokens < len(prompt)
            )
            assert_same_draw(on_other, await fresh_engine.sample(request))
        # Unloaded and loaded again under the same name (its files may have changed): nothing carried over.
        await client.unload("policy@1")
        await client.load(CheckpointRef("policy@1", str(tmp_path / "v2")))
        reloaded = await client.sample(SampleRequest(follow_up, max_tokens=12, model="policy@1", seed=7))
        assert reloaded.cached_tokens == 0
        as_v2 = await fresh_engine.sample(SampleRequest(follow_up, max_tokens=12, model="policy@2", seed=7))
        assert_same_draw(reloaded, as_v2)
    finally:
        for name in ("policy@1", "policy@2"):
            if name in cached_engine.models:
                await client.unload(name)
            if name in fresh_engine.models:
                await fresh_engine.unload(name)


async def test_a_flood_of_distinct_prefixes_stays_within_the_budget(tiny_qwen3: str) -> None:
    engine = LocalEngine(tiny_qwen3, device="cpu", batch_window_s=0.01, prefix_cache_mb=1)
    cache = engine.prefix_cache
    assert cache is not None
    prompts = [tuple(range(1000 + 300 * n, 1300 + 300 * n)) for n in range(24)]
    for prompt in prompts:
        await engine.sample(SampleRequest(prompt, max_tokens=4, seed=0))
        assert cache.held_bytes <= 1 << 20
    assert 0 < len(cache) < len(prompts)  # the oldest went
    newest = await engine.sample(SampleRequest(prompts[-1] + (7, 8), max_tokens=2))
    oldest = await engine.sample(SampleRequest(prompts[0] + (7, 8), max_tokens=2))
    assert newest.cached_tokens >= len(prompts[-1]) and oldest.cached_tokens == 0
    assert cache.queried > cache.reused > 0
    await engine.sleep()  # asleep, it holds nothing
    assert len(cache) == 0 and cache.held_bytes == 0


def test_the_cache_keeps_what_was_used_last_and_drops_what_a_longer_entry_answers() -> None:
    def states(n: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        return ((torch.zeros(1, n, 4), torch.zeros(1, n, 4)),)  # 32 bytes a token

    cache = PrefixCache(32 * 10)
    cache.put(entry("a#1", [1, 2, 3], states(3)))
    cache.put(entry("a#1", [1, 2, 3, 4, 5], states(5)))  # answers every lookup [1, 2, 3] would
    assert len(cache) == 1 and cache.held_bytes == 32 * 5
    cache.put(entry("b#2", [1, 2, 3], states(3)))
    assert cache.longest("a#1", [1, 2, 9])[1] == 2
    assert cache.longest("c#3", [1, 2, 3]) == (None, 0)  # another key's states are never an answer
    cache.put(
        entry("b#2", [7, 8, 9], states(3))
    )  # over budget: the least recently used goes, b#2's [1, 2, 3]
    assert cache.longest("b#2", [1, 2, 3])[1] == 0 and cache.longest("a#1", [1, 2])[1] == 2
    assert not cache.put(entry("a#1", list(range(11)), states(11)))  # bigger than the budget: not kept
    cache.drop("a#1")
    assert cache.longest("a#1", [1, 2])[1] == 0 and cache.held_bytes == 32 * 3
    with pytest.raises(ValueError, match="≥ 0"):
        PrefixCache(-1)


async def test_models_whose_cache_a_prefix_cannot_share_sample_without_it(
    tiny_qwen3: str, tmp_path: Path
) -> None:
    import shutil

    from transformers import AutoModelForCausalLM, MistralConfig, Qwen3_5TextConfig

    hybrid = AutoModelForCausalLM.from_config(
        Qwen3_5TextConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
        )
    )
    windowed = AutoModelForCausalLM.from_config(
        MistralConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=32,
        )
    )
    assert "LinearAttentionLayer" in (reuse_refused(hybrid) or "")
    assert "DynamicSlidingWindowLayer" in (reuse_refused(windowed) or "")
    # An engine serving the hybrid model says why it keeps no prefix cache, and samples without one.
    hybrid.save_pretrained(tmp_path / "hybrid")
    for name in os.listdir(tiny_qwen3):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(os.path.join(tiny_qwen3, name), tmp_path / "hybrid" / name)
    engine = LocalEngine(str(tmp_path / "hybrid"), device="cpu")
    assert engine.prefix_cache is None
    assert "LinearAttentionLayer" in (engine.prefix_cache_off or "")
    prompt = tuple(range(10, 60))
    first = await engine.sample(SampleRequest(prompt, max_tokens=6, seed=1))
    again = await engine.sample(SampleRequest(prompt, max_tokens=6, seed=1))
    assert first.cached_tokens == again.cached_tokens == 0 and first.completion_ids == again.completion_ids


async def test_a_conversation_through_the_gateway_reports_and_records_its_cached_tokens(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str], tiny_qwen3: str
) -> None:
    import anthropic
    import openai

    seat_id, token = seat
    engine = LocalEngine(tiny_qwen3, device="cpu")
    async with serve_gateway(ledger, renderer, engine) as running:
        chat = openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "the first turn of a conversation"}]
        first = await chat.chat.completions.create(model="base", messages=messages, max_tokens=8)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "the second"},
        ]
        second = await chat.chat.completions.create(model="base", messages=messages, max_tokens=8)
        assert first.usage is not None and second.usage is not None
        assert (
            first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
        )
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        cached = second.usage.prompt_tokens_details.cached_tokens or 0
        assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
        # Anthropic's dialect counts what its cache read apart from the input it computed.
        claude = anthropic.AsyncAnthropic(
            base_url=f"{running.url}/s/{token}", api_key="unused", max_retries=0
        )
        third = await claude.messages.create(
            model="base",
            max_tokens=8,
            messages=[
                *messages,
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "the third"},
            ],
        )
        assert (third.usage.cache_read_input_tokens or 0) >= cached
        assert third.usage.input_tokens > 0
    records = await turns(ledger, seat_id)
    assert [r.get("cached_tokens", 0) for r in records] == [0, cached, third.usage.cache_read_input_tokens]


async def test_the_engine_says_its_hit_rate_and_load_as_vllm_names_them(
    cached_engine: LocalEngine, cached_url: str, tiny_qwen3: str, tmp_path: Path
) -> None:
    """`/metrics` under vLLM's names, read by the same reader that reads vLLM's (`rollout status`, the
    dashboard): prompt tokens looked up and found, requests in flight; and why there is no cache."""
    import httpx

    from rollout.serving.engine_load import fetch_engine_load, parse_metrics

    assert (await asyncio.to_thread(httpx.get, f"{cached_url}/metrics")).status_code == 401  # the key first
    load = await asyncio.to_thread(fetch_engine_load, cached_url, API_KEY)
    assert load is not None and load.cache_off is None
    cache = cached_engine.prefix_cache
    assert cache is not None and (load.queried, load.hits) == (cache.queried, cache.reused)
    assert load.hit_rate is not None and 0 < load.hit_rate < 1 and load.in_flight == 0
    assert "prefix cache" in load.describe() and "% of" in load.describe()
    # vLLM's own exposition: summed over label sets; an engine keeping no cache says why.
    vllm_text = (
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 300.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 240.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0\n'
    )
    parsed = parse_metrics(vllm_text)
    assert (parsed.hit_rate, parsed.in_flight) == (0.8, 4)
    off = parse_metrics(
        'rollout:prefix_cache_off{model_name="base",reason="its cache has \\"linear\\" layers"} 1.0'
    )
    assert off.cache_off == 'its cache has "linear" layers' and "no prefix cache" in off.describe()
    # An engine kind with no prefix cache (Tinker's, a scripted one) says so, not "no prompt yet".
    from types import SimpleNamespace

    from rollout.engines.vllm_server import prometheus_text

    kept_none = parse_metrics(prometheus_text(SimpleNamespace(name="tinker", served_name="base")))
    assert kept_none.cache_off == "the tinker engine keeps none"
