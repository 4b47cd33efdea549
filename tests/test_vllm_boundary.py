"""rollout's vLLM boundary, checked against vLLM's own code (the locked vLLM; no GPU): its OpenAI app and
`AsyncLLM` serve the launcher's exact command line over a CPU stand-in for the engine core
(tests/vllm_standin.py), and its own parser, request and response classes judge what rollout sends and what
rollout's local engine answers.

Each test here fails on what the first reading of vLLM 0.33 found wrong: sampling defaults taken from the
checkpoint, aborted completions passed on as finished, `/sleep` cutting turns short and queueing new ones
until the wake, a 404 for an adapter vLLM does not hold, and launcher flags vLLM does not accept.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollout.config import load
from rollout.config.defaults import LORA_TARGET_MODULES
from rollout.engines.local import LocalEngine
from rollout.engines.protocol import (
    CheckpointNotServed,
    CheckpointRef,
    EngineError,
    EngineUnavailable,
    SampleRequest,
    collected,
)
from rollout.engines.vllm_client import VLLMEngine
from rollout.engines.vllm_launcher import VLLMLaunch, command, launch_for
from rollout.engines.vllm_server import build_app
from rollout.net import free_port, serving
from rollout.serving.keys import engine_api_key

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parent.parent
# tests.vllm_standin's, named here rather than imported: importing it imports vLLM into this process.
RECORD_VARIABLE = "ROLLOUT_VLLM_STANDIN_RECORD"
JUDGE_VARIABLE = "ROLLOUT_VLLM_STANDIN_JUDGE"
STANDIN_TOKENS = (1000, 1001, 1002, 1003, 1004)
STANDIN_LOGPROB = -0.5
PROMPT = (151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198)
# What Qwen checkpoints ship in generation_config.json: vLLM applies each to a request that leaves it out,
# unless told `--generation-config vllm`.
QWEN_SAMPLING_DEFAULTS = {
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "min_p": 0.05,
    "repetition_penalty": 1.05,
    "presence_penalty": 1.5,
}
PRESETS = sorted(p.stem for p in (ROOT / "rollout" / "conf" / "preset").glob("*.yaml"))
API_KEY = engine_api_key(b"boundary-engine-key")
KEYED = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class Judge:
    """What the stand-in judges with vLLM's parser and classes before it serves (one vLLM import for both)."""

    asked: dict[str, Any]
    request: Path

    def verdicts(self) -> dict[str, Any]:
        """Ready once the stand-in serves (it judges first)."""
        return json.loads(Path(f"{self.request}.verdicts").read_text())


def _argvs(model: str) -> dict[str, list[str]]:
    """The launcher's command line for each preset (served on vLLM), and three that vLLM must refuse."""
    argvs = {}
    for preset in PRESETS:
        settings = load([f"preset={preset}", "services.engine.kind=vllm"])
        launch = launch_for(settings, model, host="127.0.0.1", port=8100, served_name="base", api_key=API_KEY)
        argvs[preset] = command(launch)[0]
    plain = command(VLLMLaunch(model, api_key=API_KEY))[0]
    argvs["refused: unknown quantization"] = [*plain, "--quantization", "no-such-method"]
    argvs["refused: rank not a choice"] = [*plain, "--max-lora-rank", "12"]
    argvs["refused: unknown flag"] = [*plain, "--no-such-flag"]
    return argvs


async def _local_server_answers(model: str) -> list[tuple[str, str, Any]]:
    """What rollout's local engine server answers, as (what, vLLM's class, body)."""
    client = VLLMEngine("http://unused", api_key=None)
    body = client._payload(SampleRequest(PROMPT, max_tokens=4, seed=1))
    answers: list[tuple[str, str, Any]] = []
    async with (
        serving(build_app(LocalEngine(model, device="cpu"), api_key=API_KEY)) as url,
        aiohttp.ClientSession(url, headers=KEYED) as http,
        aiohttp.ClientSession(url) as keyless,
    ):
        async with keyless.post("/v1/completions", json=body) as answer:
            assert answer.status == 401
            answers.append(("no key", "ErrorResponse", await answer.json()))
        async with http.post("/v1/completions", json=body) as answer:
            answers.append(("completion", "CompletionResponse", await answer.json()))
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post("/v1/completions", json=streamed) as answer:
            events = [line[5:].strip() async for line in answer.content if line.startswith(b"data:")]
        answers += [
            ("stream chunk", "CompletionStreamResponse", json.loads(e)) for e in events if e != b"[DONE]"
        ]
        async with http.post("/v1/completions", json={**body, "model": "nope"}) as answer:
            answers.append(("unknown model", "ErrorResponse", await answer.json()))
        async with http.post("/pause"), http.post("/v1/completions", json=body) as answer:
            assert answer.status == 503
            answers.append(("paused", "ErrorResponse", await answer.json()))
    return answers


@pytest.fixture(scope="module")
async def judge(qwen_like: Path, tiny_qwen3: str, tmp_path_factory: pytest.TempPathFactory) -> Judge:
    client = VLLMEngine("http://unused", api_key=None)
    asked = {
        "argvs": _argvs(str(qwen_like)),
        "payloads": {
            "sample": client._payload(SampleRequest(PROMPT, max_tokens=8, seed=3, stop_token_ids=(151645,))),
            "stream": {**client._payload(SampleRequest(PROMPT, max_tokens=8)), "stream": True},
        },
        "responses": await _local_server_answers(tiny_qwen3),
    }
    request = {
        "argvs": list(asked["argvs"].values()),
        "payloads": list(asked["payloads"].values()),
        "responses": [[kind, body] for _, kind, body in asked["responses"]],
    }
    path = tmp_path_factory.mktemp("judge") / "request.json"
    path.write_text(json.dumps(request))
    return Judge(asked, path)


@dataclass
class StandIn:
    engine: VLLMEngine
    record: Path

    def requests(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    async def received(self, count: int) -> None:
        """Wait until vLLM's engine core has received `count` requests in all: a request still in vLLM's front
        end when a test sleeps the engine would be queued until the wake, not aborted."""
        deadline = time.monotonic() + 60
        while len(self.requests()) < count:
            assert time.monotonic() < deadline, f"vLLM received {len(self.requests())} of {count} requests"
            await asyncio.sleep(0.05)

    async def control(self, path: str, **query: str) -> int:
        """POST `path` with the key (vLLM asks none there: see the key's test)."""
        return (await self.ask("POST", path, KEYED, **query))[0]

    async def ask(self, method: str, path: str, headers: dict[str, str], **query: str) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.request(method, f"{self.engine.base_url}{path}", params=query) as answer,
        ):
            text = await answer.text()
            return answer.status, json.loads(text) if text.startswith("{") else text


@pytest.fixture(scope="module")
def qwen_like(tiny_qwen3: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 with the sampling defaults a Qwen checkpoint ships in generation_config.json, and
    Qwen3's context (40960 positions), so each preset's context is a model's."""
    folder = tmp_path_factory.mktemp("qwen-like")
    for file in Path(tiny_qwen3).iterdir():
        if file.name not in ("generation_config.json", "config.json"):
            (folder / file.name).symlink_to(file)
    generation = json.loads((Path(tiny_qwen3) / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, **QWEN_SAMPLING_DEFAULTS}))
    config = json.loads((Path(tiny_qwen3) / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 40960}))
    return folder


@pytest.fixture(scope="module")
async def standin(
    judge: Judge, qwen_like: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StandIn]:
    """vLLM's app over the stand-in engine core, started with exactly the launcher's command line; it judges
    what `judge` asks before it serves."""
    port = free_port()
    launch = VLLMLaunch(
        str(qwen_like), port=port, max_model_len=2048, max_lora_rank=8, max_num_seqs=2, api_key=API_KEY
    )
    argv, env = command(launch)  # the key in env (VLLM_API_KEY), as the launcher gives it
    assert argv[:2] == ["vllm", "serve"]
    record = tmp_path_factory.mktemp("standin") / "requests.jsonl"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.vllm_standin",
        "serve",
        *argv[2:],
        cwd=ROOT,
        env={**os.environ, **env, RECORD_VARIABLE: str(record), JUDGE_VARIABLE: str(judge.request)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    engine = VLLMEngine(f"http://127.0.0.1:{port}", api_key=API_KEY)
    try:
        deadline = time.monotonic() + 240
        while not await engine.health():
            if process.returncode is not None or time.monotonic() > deadline:
                output = (await process.stdout.read()).decode() if process.stdout else ""
                pytest.fail(f"vLLM's app over the stand-in did not come up:\n{output[-3000:]}")
            await asyncio.sleep(0.5)
        yield StandIn(engine, record)
    finally:
        await engine.close()
        if process.returncode is None:
            process.terminate()
            await process.wait()


async def test_vllm_samples_with_what_the_request_says_and_none_of_the_checkpoints_defaults(
    standin: StandIn, judge: Judge
) -> None:
    """vLLM reports raw logprobs (temperature 1, before top_p: the engine protocol's): for a turn at
    temperature 1 and top_p 1 they are the sampling distribution's only when no top_k, min_p or penalty comes
    from the checkpoint. The client's requests are vLLM `CompletionRequest`s with no key vLLM would silently
    drop."""
    asked = SampleRequest(PROMPT, max_tokens=5, temperature=0.6, top_p=0.95, seed=9, stop_token_ids=(151645,))
    result = await standin.engine.sample(asked)
    streamed = [chunk async for chunk in standin.engine.stream(asked)]
    assert result.completion_ids == STANDIN_TOKENS and result.finish_reason == "length"
    assert result.logprobs == (STANDIN_LOGPROB,) * 5
    assert (
        tuple(t for c in streamed for t in c.ids) == STANDIN_TOKENS and streamed[-1].finish_reason == "length"
    )
    requests = standin.requests()[-2:]
    assert [r["prompt"] for r in requests] == [list(PROMPT)] * 2
    for sampled in (r["sampling"] for r in requests):
        assert (sampled["temperature"], sampled["top_p"], sampled["seed"]) == (0.6, 0.95, 9)
        assert sampled["top_k"] in (0, -1), f"top_k {sampled['top_k']} came from generation_config.json"
        assert sampled["min_p"] == 0 and sampled["repetition_penalty"] == 1
        assert sampled["presence_penalty"] == 0 and sampled["frequency_penalty"] == 0
        assert (sampled["logprobs"], sampled["skip_special_tokens"], sampled["max_tokens"]) == (0, False, 5)
        assert sampled["stop_token_ids"] == [151645]
    verdicts = judge.verdicts()
    for name, verdict in zip(judge.asked["payloads"], verdicts["payloads"], strict=True):
        assert verdict == {"ok": True, "undeclared": []}, f"{name}: {verdict}"


async def test_vllm_says_how_many_prompt_tokens_its_prefix_cache_held(standin: StandIn) -> None:
    """With the launcher's flags, vLLM's own app reports what its prefix cache held (in whole 16-token blocks,
    never a prompt's last token) as `usage.prompt_tokens_details.cached_tokens`, streamed or not, and the
    client reads it: what each turn records."""
    opening = tuple(range(2000, 2040))
    first = await standin.engine.sample(SampleRequest(opening, max_tokens=3))
    assert first.cached_tokens == 0
    follow = opening + first.completion_ids + tuple(range(3000, 3010))
    assert (await standin.engine.sample(SampleRequest(follow, max_tokens=3))).cached_tokens == 32  # of 40
    chunks = [chunk async for chunk in standin.engine.stream(SampleRequest((*follow, 7), max_tokens=3))]
    assert collected(chunks, "base").cached_tokens == 48  # of the 53 just sent


async def test_vllm_takes_its_key_from_the_launchers_environment_and_checks_it_on_every_route(
    standin: StandIn,
) -> None:
    """The launcher gives vLLM the engine API key as VLLM_API_KEY, never in argv: vLLM's own middleware then
    refuses its /v1 routes (sampling, models, LoRA loading) without it, or with another key, in its own shape.
    The routes vLLM leaves open (/sleep, /wake_up, /pause, /is_sleeping, in dev mode /collective_rpc ...)
    the launcher's `--middleware` guard (rollout.engines.vllm_guard) closes: a web page's cross-site POST, or
    a process without the key, puts no engine to sleep."""
    wrong = {"Authorization": f"Bearer {engine_api_key(b'another key')}"}
    for headers in ({}, wrong, {"Authorization": "Bearer rs-" + "0" * 40}):
        assert await standin.ask("GET", "/v1/models", headers) == (401, {"error": "Unauthorized"})
        status, _ = await standin.ask("POST", "/v1/load_lora_adapter", headers)
        assert status == 401
    assert (await standin.ask("GET", "/v1/models", KEYED))[0] == 200
    assert (await standin.ask("GET", "/health", {}))[0] == 200
    # What vLLM 0.33 leaves open, closed by the guard, and open to the key.
    for method, path in (
        ("GET", "/is_sleeping"),
        ("POST", "/sleep"),
        ("POST", "/pause"),
        ("POST", "/collective_rpc"),
    ):
        for headers in ({}, wrong, {"Authorization": "Bearer rs-" + "0" * 40}):
            status, body = await standin.ask(method, path, headers)
            assert (status, body["error"]) == (401, "Unauthorized"), (method, path, body)
    assert await standin.ask("GET", "/is_sleeping", KEYED) == (200, {"is_sleeping": False})


async def test_what_vllm_aborts_is_never_passed_on_as_finished(standin: StandIn) -> None:
    """vLLM's /sleep defaults to `abort`: what is in flight comes back 200 with `finish_reason: "abort"` and
    partial tokens. The client raises EngineUnavailable (sampled again, or recorded aborted mid-stream)."""
    before = len(standin.requests())
    whole = asyncio.create_task(standin.engine.sample(SampleRequest(PROMPT, max_tokens=1000)))
    chunks = standin.engine.stream(SampleRequest(PROMPT, max_tokens=1000))
    first = await anext(chunks)
    assert first.ids and first.finish_reason is None
    await standin.received(before + 2)
    assert await standin.control("/sleep", level="1", mode="abort") == 200
    with pytest.raises(EngineUnavailable, match="aborted"):
        await asyncio.wait_for(whole, 30)

    async def read_to_the_end() -> None:
        async for _ in chunks:
            pass

    with pytest.raises(EngineUnavailable, match="aborted"):
        await asyncio.wait_for(read_to_the_end(), 30)
    assert await standin.control("/wake_up") == 200


async def test_sleep_finishes_what_is_in_flight_and_refuses_new_turns_until_the_wake(
    standin: StandIn,
) -> None:
    """vLLM queues a request that reaches it asleep until it wakes (shown first, with a bare /sleep), so a
    turn would hang for a whole training step; the client's sleep pauses first: what is being generated
    finishes, what is still queued is aborted (sampled again later), and a new request is refused at once with
    a 503 (the gateway's cue to hold the turn) until the wake."""
    assert await standin.control("/sleep", level="1", mode="wait") == 200
    queued = asyncio.create_task(standin.engine.sample(SampleRequest(PROMPT, max_tokens=3)))
    done, _ = await asyncio.wait([queued], timeout=1.5)
    assert not done, "vLLM 0.33 holds a request that arrives while it sleeps"
    assert await standin.control("/wake_up") == 200
    assert (await asyncio.wait_for(queued, 10)).completion_ids == STANDIN_TOKENS[:3]

    # Two requests run (--max-num-seqs 2); a third waits its turn. The pause lets the two finish and leaves
    # the third queued; the sleep then aborts it, so the gateway samples it again after the wake, not after
    # the step.
    before = len(standin.requests())
    streams = [standin.engine.stream(SampleRequest(PROMPT, max_tokens=60)) for _ in range(2)]
    firsts = [await anext(chunks) for chunks in streams]
    queued_turn = asyncio.create_task(standin.engine.sample(SampleRequest(PROMPT, max_tokens=60)))
    await standin.received(before + 3)
    asleep = asyncio.create_task(standin.engine.sleep())
    for first, chunks in zip(firsts, streams, strict=True):
        rest = [chunk async for chunk in chunks]
        assert len(first.ids) + sum(len(c.ids) for c in rest) == 60 and rest[-1].finish_reason == "length"
    await asyncio.wait_for(asleep, 10)
    with pytest.raises(EngineUnavailable, match="aborted"):
        await asyncio.wait_for(queued_turn, 5)
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match="paused"):
        await standin.engine.sample(SampleRequest(PROMPT, max_tokens=3))
    with pytest.raises(EngineUnavailable, match="paused"):
        await anext(standin.engine.stream(SampleRequest(PROMPT, max_tokens=3)))
    assert time.monotonic() - started < 5, "refused at once"
    await standin.engine.wake()
    assert (await standin.engine.sample(SampleRequest(PROMPT, max_tokens=2))).finish_reason == "length"


async def test_adapters_load_serve_and_unload_as_the_follower_expects(
    standin: StandIn, tiny_qwen3: str, tmp_path: Path
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    def adapter(rank: int, folder: Path, targets: tuple[str, ...] = LORA_TARGET_MODULES) -> str:
        model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
        config = LoraConfig(r=rank, target_modules=list(targets), task_type="CAUSAL_LM")
        get_peft_model(model, config).save_pretrained(str(folder))
        return str(folder)

    step1 = await asyncio.to_thread(adapter, 8, tmp_path / "step1")
    await standin.engine.load(CheckpointRef("step1", step1))
    await standin.engine.load(CheckpointRef("step1", step1))  # a restarted follower loads what vLLM holds
    assert "step1" in await standin.engine.models()
    result = await standin.engine.sample(SampleRequest(PROMPT, max_tokens=2, model="step1"))
    assert result.model == "step1" and standin.requests()[-1]["lora"] == "step1"
    with pytest.raises(CheckpointNotServed):
        await standin.engine.sample(SampleRequest(PROMPT, max_tokens=2, model="step2"))
    too_big = await asyncio.to_thread(adapter, 16, tmp_path / "rank16")
    with pytest.raises((EngineError, EngineUnavailable), match="rank"):
        await standin.engine.load(CheckpointRef("rank16", too_big))
    # vLLM holds LoRA slots for --lora-target-modules only, and would apply such an adapter in part, silently.
    wider = await asyncio.to_thread(adapter, 8, tmp_path / "wider", (*LORA_TARGET_MODULES, "gate_proj"))
    with pytest.raises(EngineError, match="gate_proj"):
        await standin.engine.load(CheckpointRef("wider", wider))
    await standin.engine.unload("step1")
    with pytest.raises(KeyError):  # the follower's "already gone"
        await standin.engine.unload("step1")
    with pytest.raises(KeyError):
        await standin.engine.unload("never-loaded")


async def test_vllms_parser_accepts_the_launchers_command_line_for_every_preset(
    standin: StandIn, judge: Judge
) -> None:
    """Parsed and validated by `vllm serve`'s own parser, and turned into vLLM's engine configuration: a flag
    vLLM removed, a choice it does not offer, or a quantization method without its plugin fails here."""
    verdicts = judge.verdicts()["argvs"]
    named = dict(zip(judge.asked["argvs"], verdicts, strict=True))
    assert set(PRESETS) >= {"cpu-micro", "cpu-tiny", "minecraft-one-gpu"}
    for name, verdict in named.items():
        if name.startswith("refused"):
            assert not verdict["ok"], f"the judge accepted {name}"
        else:
            assert verdict.pop("ok"), f"vLLM refuses preset {name}'s command line: {verdict}"
            # Prefix caching on, and answers that say what it held: as vLLM's parser reads the command line.
            assert verdict == {"prefix_caching": True, "prompt_tokens_details": True}, name


async def test_the_local_engine_server_answers_in_vllms_own_response_classes(
    standin: StandIn, judge: Judge
) -> None:
    """rollout's local engine server speaks vLLM's dialect to the same client: each of its answers (a
    completion, every streamed chunk with the usage chunk, a 404 and a paused 503) validates as vLLM's own
    class."""
    verdicts = judge.verdicts()["responses"]
    kinds = [kind for _, kind, _ in judge.asked["responses"]]
    assert kinds.count("CompletionStreamResponse") >= 3 and kinds.count("ErrorResponse") == 3
    for (what, kind, body), verdict in zip(judge.asked["responses"], verdicts, strict=True):
        assert verdict == {"ok": True}, f"{what} is no vLLM {kind}: {verdict}\n{body}"
