"""Long conversations: what the prefix cache and cache-affine routing save, and what stickiness does to
staleness.

Every turn goes through a real gateway (rendering, admission, recording in the ledger of an embedded stack) to
local engines in the same process, serving SmolLM2-135M on the CPU; each user message is about
`NEW_TOKENS` tokens and each answer at most `ANSWER_TOKENS`, seeded, so both sides of a comparison sample the
same conversation (the cache's invariant).
- `cache`: one `TURNS`-turn conversation on one engine with `services.engine.prefix_cache_mb` at its default
  against 0. Reported: engine time per episode (the turns' recorded `compute_s`), its ratio (goal >= 3x), and
  time per turn by turn index, with the cache flat (`benchmarks/multiturn.png`).
- `routing`: two replicas, `CONVERSATIONS` conversations of `ROUTED_TURNS` turns played at once,
  `routing.mode=affine` against `rotate` (the order before affinity). Reported: hit rate (cached / prompt
  tokens over every turn), the most any routing could hit (each turn reusing all its conversation's last turn
  computed), and turns/s (goals >= 90% hits, >= 1.5x turns/s).
- `staleness`: the gateway's routing order (`rollout.gateway.affinity.ordered`) replayed over a simulated
  run: conversations of `TURNS` turns start and end continuously while a checkpoint is published every
  `STEP_TURNS` turn-times and engines serve the newest `max_lag + 1` versions. Reported, sticky against not:
  the mean and max staleness of a turn when it begins, and the share of conversations sampled by one
  checkpoint throughout. A simulation of the routing policy (no model), named as one.
- `gateway`: the gateway's own cost on long conversations: `CONVERSATIONS` conversations of `TURNS` turns
  at once against a scripted engine that answers at once (everything in this process: the clients, the
  gateway, the engine). Reported: process CPU per turn (an upper bound for the gateway: it includes the
  clients and the scripted engine), and ledger appends per turn and per conversation, counted in the seats'
  streams. What docs/deploy.md sizes fleets from.
The last line printed is one JSON object with every number. `--quick` checks that it works: the tiny random
Qwen3 model instead of SmolLM2, fewer and shorter conversations.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

TURNS = 24
NEW_TOKENS = 150
ANSWER_TOKENS = 16
CONVERSATIONS = 16
ROUTED_TURNS = 24
ROUTED_NEW_TOKENS = 60
ROUTED_ANSWER_TOKENS = 8
STEP_TURNS = 8  # a checkpoint per this many turn-times, in the staleness simulation
MAX_LAG = 2
PLOT = Path(__file__).with_name("multiturn.png")
WORDS = ("agent", "reads", "file", "runs", "tests", "failed", "edits", "function", "change", "keeps", "case")
WORDS += ("passing", "while", "log", "grows", "longer", "each", "turn", "the", "then", "and", "a", "before")


def _message(tokenizer: Any, index: int, tokens: int) -> str:
    """A user message of about `tokens` tokens, different for each `index`."""
    rng = random.Random(index)
    words: list[str] = [f"turn {index}:"]
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < tokens:
        words.append(rng.choice(WORDS))
    return " ".join(words)


@asynccontextmanager
async def _gateway(ledger: Any, renderer: Any, engines: list[Any], routing: Any) -> AsyncIterator[str]:
    from rollout.gateway.admission import Admission, EngineSlot
    from rollout.gateway.app import build_app
    from rollout.gateway.service import Gateway
    from rollout.net import serving

    admission = Admission(ledger, [EngineSlot(e) for e in engines], wait_s=120.0, routing=routing)
    gateway = Gateway(ledger, renderer, admission, max_context=8192, default_max_tokens=64)
    async with serving(build_app(gateway, model_names=["base"])) as url:
        yield url


async def _seats(ledger: Any, secret: bytes, count: int) -> list[tuple[str, str]]:
    from rollout.gateway.seats import open_seat

    seats = []
    for _ in range(count):
        seat_id = f"bench-{uuid.uuid4().hex[:10]}"
        seats.append((seat_id, (await open_seat(ledger, secret, seat_id=seat_id, agent="solver"))[1]))
    return seats


async def _records(ledger: Any, seat_id: str) -> list[dict[str, Any]]:
    from rollout.ledger import Kind
    from rollout.ledger.streams import seat_stream

    events = await ledger.read(seat_stream(seat_id), limit=100000)
    return [dict(e.payload) for e in events if e.kind == Kind.TURN_RECORDED]


async def _converse(
    url: str, token: str, tokenizer: Any, *, turns: int, new_tokens: int, answer_tokens: int, index: int
) -> list[float]:
    """One conversation of `turns` turns; the wall time of each."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/s/{token}/v1", api_key="unused", max_retries=0, timeout=600)
    messages: list[Any] = []
    times = []
    for turn in range(turns):
        messages.append({"role": "user", "content": _message(tokenizer, index * 1000 + turn, new_tokens)})
        started = time.perf_counter()
        answer = await client.chat.completions.create(
            model="base", messages=messages, max_tokens=answer_tokens, seed=index * 1000 + turn
        )
        times.append(time.perf_counter() - started)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    await client.close()
    return times


async def _play_all(
    url: str,
    seats: list[tuple[str, str]],
    tokenizer: Any,
    turns: int,
    new_tokens: int,
    answer_tokens: int,
    first: int,
) -> None:
    """A conversation per seat, all at once (conversation `first + i` on seat i)."""
    await asyncio.gather(
        *(
            _converse(
                url,
                token,
                tokenizer,
                turns=turns,
                new_tokens=new_tokens,
                answer_tokens=answer_tokens,
                index=first + i,
            )
            for i, (_, token) in enumerate(seats)
        )
    )


async def _cache(ledger: Any, renderer: Any, model: str, secret: bytes, turns: int) -> dict[str, Any]:
    from rollout.config import RoutingSettings
    from rollout.engines.local import LocalEngine

    sides: dict[str, Any] = {}
    for side, budget in (("cache", 1024), ("no cache", 0)):
        engine = LocalEngine(model, device="cpu", prefix_cache_mb=budget)
        ((seat_id, token),) = await _seats(ledger, secret, 1)
        async with _gateway(ledger, renderer, [engine], RoutingSettings()) as url:
            wall = await _converse(
                url,
                token,
                renderer.tokenizer,
                turns=turns,
                new_tokens=NEW_TOKENS,
                answer_tokens=ANSWER_TOKENS,
                index=7,
            )
        records = await _records(ledger, seat_id)
        compute = [float(r["timings"].get("compute_s", 0.0)) for r in records]
        sides[side] = {
            "engine_s": round(sum(compute), 2),
            "compute_s_by_turn": [round(c, 3) for c in compute],
            "wall_s_by_turn": [round(w, 3) for w in wall],
            "prompt_tokens_last_turn": records[-1]["prompt_prefix_len"]
            + len(records[-1]["prompt_ids_delta"]),
            "cached_tokens": sum(int(r.get("cached_tokens", 0)) for r in records),
            "completions": [r["completion_ids"] for r in records],
        }
        print(f"cache: {side}: {sides[side]['engine_s']} s of engine time", file=sys.stderr, flush=True)
    same = sides["cache"].pop("completions") == sides["no cache"].pop("completions")
    cached, fresh = sides["cache"], sides["no cache"]
    first, last = cached["compute_s_by_turn"][1], cached["compute_s_by_turn"][-1]
    return {
        "turns": turns,
        "speedup": round(fresh["engine_s"] / max(cached["engine_s"], 1e-9), 2),
        "same_tokens": same,
        "cached_last_over_second_turn": round(last / max(first, 1e-9), 2),
        **{side.replace(" ", "_"): numbers for side, numbers in sides.items()},
    }


async def _routing(
    ledger: Any, renderer: Any, model: str, secret: bytes, conversations: int, turns: int
) -> dict[str, Any]:
    from rollout.config import RoutingMode, RoutingSettings
    from rollout.engines.local import LocalEngine

    sides: dict[str, Any] = {}
    for mode in (RoutingMode.affine, RoutingMode.rotate):
        engines = [LocalEngine(model, device="cpu", batch_window_s=0.02) for _ in range(2)]
        for number, engine in enumerate(engines, start=1):
            engine.name = f"replica-{number}"  # as each turn's record names it
        seats = await _seats(ledger, secret, conversations)
        async with _gateway(ledger, renderer, engines, RoutingSettings(mode=mode)) as url:
            started = time.perf_counter()
            await _play_all(
                url, seats, renderer.tokenizer, turns, ROUTED_NEW_TOKENS, ROUTED_ANSWER_TOKENS, 100
            )
            elapsed = time.perf_counter() - started
        by_seat = [await _records(ledger, seat_id) for seat_id, _ in seats]
        records = [r for rs in by_seat for r in rs]
        prompt = sum(_prompt_tokens(r) for r in records)
        cached = sum(int(r.get("cached_tokens", 0)) for r in records)
        # At best a turn reuses all its conversation's last turn computed: its prompt and every token drawn
        # but the last; its own new tokens are never cached.
        possible = sum(
            min(_prompt_tokens(turn), _prompt_tokens(before) + len(before["completion_ids"]) - 1)
            for rs in by_seat
            for before, turn in itertools.pairwise(rs)
        )
        engines_used = {r["engine"] for r in records}
        sides[mode.value] = {
            "turns_per_s": round(len(records) / elapsed, 2),
            "hit_rate": round(cached / prompt, 3),
            "possible_hit_rate": round(possible / prompt, 3),
            "seconds": round(elapsed, 1),
            "turns": len(records),
            "engines": len(engines_used),
        }
        print(f"routing: {mode.value}: {sides[mode.value]}", file=sys.stderr, flush=True)
    return {
        "conversations": conversations,
        "turns_each": turns,
        "turns_per_s_ratio": round(sides["affine"]["turns_per_s"] / sides["rotate"]["turns_per_s"], 2),
        **sides,
    }


async def _gateway_cost(
    ledger: Any, renderer: Any, secret: bytes, conversations: int, turns: int
) -> dict[str, Any]:
    from rollout.config import RoutingSettings
    from rollout.contracts import Message
    from rollout.engines.scripted import ScriptedEngine

    engine = ScriptedEngine(renderer, lambda _: Message.assistant("Done: the tests pass now."))
    seats = await _seats(ledger, secret, conversations)
    async with _gateway(ledger, renderer, [engine], RoutingSettings()) as url:
        cpu, started = time.process_time(), time.perf_counter()
        await _play_all(url, seats, renderer.tokenizer, turns, NEW_TOKENS, ANSWER_TOKENS, 500)
        cpu, elapsed = time.process_time() - cpu, time.perf_counter() - started
    events = [len(await ledger.read(seat_stream_of(seat_id), limit=100000)) for seat_id, _ in seats]
    turn_events = sum([len(await _records(ledger, seat_id)) for seat_id, _ in seats])
    played = conversations * turns
    return {
        "conversations": conversations,
        "turns_each": turns,
        "cpu_ms_per_turn": round(1000 * cpu / played, 2),
        "turns_per_s": round(played / elapsed, 1),
        "appends_per_turn": round(turn_events / played, 2),
        "appends_per_conversation_besides_turns": round((sum(events) - played) / conversations, 2),
    }


def seat_stream_of(seat_id: str) -> str:
    from rollout.ledger.streams import seat_stream

    return seat_stream(seat_id)


def _prompt_tokens(record: dict[str, Any]) -> int:
    return int(record["prompt_prefix_len"]) + len(record["prompt_ids_delta"])


def _staleness(conversations: int, turns: int, sticky: bool, seed: int = 0) -> dict[str, float]:
    """Simulated: `conversations` slots, each playing conversations of `turns` turns back to back (starting
    staggered); time advances one turn per conversation per tick; a checkpoint every `STEP_TURNS` ticks; two
    engines serve the newest max_lag + 1 versions. Each turn begins where `ordered` puts it."""
    from rollout.gateway.affinity import Affinities, Conversation, Loads, ordered
    from rollout.gateway.routing import EngineSlot

    class Engine:  # routing needs only a name and a URL
        def __init__(self, name: str) -> None:
            self.name, self.base_url = name, f"http://{name}"

    engines = [Engine("a"), Engine("b")]
    rng = random.Random(seed)
    memory, loads = Affinities(), Loads()
    newest, lags, single, finished = 0, [], 0, 0
    progress = [rng.randrange(turns) for _ in range(conversations)]
    versions: list[set[int]] = [set() for _ in range(conversations)]
    ids = list(range(conversations))
    for tick in range(turns * 12):
        if tick and tick % STEP_TURNS == 0:
            newest += 1
        served = range(max(0, newest - MAX_LAG), newest + 1)
        found = [
            EngineSlot(engine, f"p@{v}", v, policy="p")  # pyright: ignore[reportArgumentType]
            for v in sorted(served, reverse=True)
            for engine in engines
        ]
        for slot_index in range(conversations):
            talk = Conversation(segment=f"c{ids[slot_index]}", seat=f"s{ids[slot_index]}")
            last = memory.last(talk) if progress[slot_index] else None
            chosen = ordered(found, last, loads, sticky=sticky, slack=4, turn=tick)[0]
            memory.remember(talk, chosen)
            lags.append(newest - chosen.version)
            versions[slot_index].add(chosen.version)
            progress[slot_index] += 1
            if progress[slot_index] == turns:  # the conversation ends; a new one takes its place
                finished += 1
                single += len(versions[slot_index]) == 1
                progress[slot_index], versions[slot_index] = 0, set()
                ids[slot_index] += conversations
    return {
        "staleness_mean": round(sum(lags) / len(lags), 3),
        "staleness_max": float(max(lags)),
        "one_checkpoint_share": round(single / max(1, finished), 3),
    }


def _plot(cache: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5), dpi=120)
    for side, label in (("no_cache", "prefix cache off"), ("cache", "prefix cache on")):
        times = cache[side]["compute_s_by_turn"]
        axis.plot(
            range(1, len(times) + 1), times, marker="o", markersize=3, label=f"{label}: {sum(times):.0f} s"
        )
    axis.set_xlabel("turn of the conversation")
    axis.set_ylabel("engine seconds for the turn")
    axis.set_title(
        f"SmolLM2-135M on {os.cpu_count()} CPUs, ~{NEW_TOKENS} new tokens a turn through the gateway",
        fontsize=9,
    )
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(PLOT)
    plt.close(figure)


async def _measure(quick: bool, scratch: Path, ledger_url: str) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from rollout.engines.models import SMOLLM2, TINY_QWEN3, resolve
    from rollout.gateway.seats import load_secret
    from rollout.ledger import Ledger
    from rollout.rendering import ModelRenderer, renderer_for_model

    models_dir = Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )
    spec = TINY_QWEN3 if quick else SMOLLM2  # quick only checks that it works: the tiny random model
    model = resolve(spec, models_dir)
    renderer = ModelRenderer(AutoTokenizer.from_pretrained(model), renderer_for_model(spec))
    async with await Ledger.connect(ledger_url) as ledger:
        secret = load_secret(scratch / "secret")
        cache = await _cache(ledger, renderer, model, secret, 6 if quick else TURNS)
        routing = await _routing(
            ledger, renderer, model, secret, 4 if quick else CONVERSATIONS, 4 if quick else ROUTED_TURNS
        )
        gateway = await _gateway_cost(
            ledger, renderer, secret, 4 if quick else CONVERSATIONS, 6 if quick else TURNS
        )
        print(f"gateway: {gateway}", file=sys.stderr, flush=True)
    staleness = {
        "sticky": _staleness(CONVERSATIONS, TURNS, sticky=True),
        "not_sticky": _staleness(CONVERSATIONS, TURNS, sticky=False),
        "max_lag": MAX_LAG,
        "checkpoint_every_turns": STEP_TURNS,
    }
    return {"cache": cache, "routing": routing, "staleness": staleness, "gateway": gateway}


def main(quick: bool = False) -> int:
    from benchmarks.stack import bench_stack

    with (
        tempfile.TemporaryDirectory(prefix="rollout-bench-multiturn-") as scratch,
        bench_stack(Path(scratch)) as bench,
    ):
        result = asyncio.run(_measure(quick, Path(scratch), bench.settings.ledger_url))
    if not quick:
        _plot(result["cache"])
    cache, routing = result["cache"], result["routing"]
    summary = {
        "benchmark": "multiturn",
        "cache_speedup": cache["speedup"],
        "cache_goal_met": cache["speedup"] >= 3.0,
        "same_tokens": cache["same_tokens"],
        "affine_hit_rate": routing["affine"]["hit_rate"],
        "rotate_hit_rate": routing["rotate"]["hit_rate"],
        "turns_per_s_ratio": routing["turns_per_s_ratio"],
        "routing_goals_met": routing["affine"]["hit_rate"] >= 0.9 and routing["turns_per_s_ratio"] >= 1.5,
        **result,
    }
    for side in ("cache", "no_cache"):
        summary["cache"][side].pop("wall_s_by_turn", None)
    print(json.dumps(summary))
    return 0
