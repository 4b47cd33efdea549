"""Cache-affine, load-aware, version-sticky routing: a conversation's turns stay on the engine (and the
checkpoint) that served its last while load and max_lag allow, spread when load does not, and move on with
nothing lost when their engine dies."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from rollout import config
from rollout.config import RoutingMode, RoutingSettings
from rollout.engines.local import LocalEngine
from rollout.engines.vllm_client import VLLMEngine
from rollout.engines.vllm_server import build_app
from rollout.gateway.affinity import Affinities, Conversation, Loads, ordered, rotate
from rollout.gateway.routing import EngineSlot
from rollout.gateway.seats import load_secret, open_seat
from rollout.ledger import Ledger
from rollout.net import serving
from rollout.rendering import ModelRenderer
from tests.gatewayutil import serve_gateway, turns

API_KEY = "routing-test-engine-key"


@dataclass(frozen=True)
class Stub:
    """An engine as routing sees it: a name and a URL."""

    name: str

    @property
    def base_url(self) -> str:
        return f"http://{self.name}"


A, B, C = Stub("a"), Stub("b"), Stub("c")


def slot(engine: Stub, version: int) -> EngineSlot:
    return EngineSlot(engine, f"p@{version}" if version else "base", version, policy="p" if version else None)  # pyright: ignore[reportArgumentType]


def names(slots: list[EngineSlot]) -> list[tuple[str, int]]:
    return [(s.engine.name, s.version) for s in slots]


def loaded(**counts: int) -> Loads:
    loads = Loads()
    for name, count in counts.items():
        for _ in range(count):
            loads.begin(Stub(name))  # pyright: ignore[reportArgumentType]
    return loads


def test_a_conversation_stays_on_its_engine_and_checkpoint_while_load_allows() -> None:
    found = [slot(A, 2), slot(B, 2), slot(A, 1), slot(B, 1)]  # as admission gives them: freshest first
    memory = Affinities()
    talk = Conversation(segment="s/1", seat="s")
    assert memory.last(talk) is None
    # A first turn: the least loaded engine, freshest version first.
    assert names(ordered(found, None, loaded(a=3, b=1), sticky=True, slack=4, turn=0))[0] == ("b", 2)
    memory.remember(
        talk, found[2]
    )  # its last turn: engine a, version 1 (a checkpoint behind, within max_lag)
    last = memory.last(talk)
    # Sticky: the same engine and checkpoint, though version 2 is out and a is busier (within the slack), then
    # the other engine serving version 1, then the rest freshest first.
    assert names(ordered(found, last, loaded(a=3, b=0), sticky=True, slack=4, turn=0)) == [
        ("a", 1),
        ("b", 1),
        ("b", 2),
        ("a", 2),
    ]
    # Past the slack the turn goes where the load is least: moving costs one prefill, queueing costs more.
    assert names(ordered(found, last, loaded(a=4, b=0), sticky=True, slack=4, turn=0))[0] == ("b", 1)
    # Not sticky: the freshest version; its last engine only when it was on the freshest checkpoint.
    assert names(ordered(found, last, loaded(), sticky=False, slack=4, turn=0))[0][1] == 2
    memory.remember(talk, found[0])
    assert names(ordered(found, memory.last(talk), loaded(a=2), sticky=False, slack=4, turn=1))[0] == ("a", 2)
    # A new segment of the same seat (a sub-agent, a compaction) starts where the seat's last turn was.
    assert memory.last(Conversation(segment="s/2", seat="s")) == memory.last(talk)


def test_routing_only_orders_what_admission_found_eligible() -> None:
    """An engine serving only a checkpoint outside max_lag is not in `found`: no order brings it back."""
    found = [slot(B, 3), slot(C, 3)]
    memory = Affinities()
    memory.remember(Conversation("s/1", "s"), slot(A, 1))  # its engine and checkpoint are no longer eligible
    for sticky in (True, False):
        again = ordered(
            found, memory.last(Conversation("s/1", "s")), loaded(), sticky=sticky, slack=4, turn=0
        )
        assert sorted(names(again)) == sorted(names(found))
    assert names(rotate(found, 1)) == [("c", 3), ("b", 3)]
    ends = Loads()
    end = ends.begin(A)  # pyright: ignore[reportArgumentType]
    end()
    end()  # ending twice counts once
    assert ends.of(A) == 0  # pyright: ignore[reportArgumentType]


def test_a_bad_routing_setting_is_one_line_naming_it() -> None:
    for override, said in [
        ("routing.mode=nearest", "'routing.mode'"),
        ("routing.affinity_slack=0", "'routing.affinity_slack': 0"),
        ("services.engine.replicas=0", "'services.engine.replicas': 0"),
    ]:
        with pytest.raises(config.ConfigError, match=said) as refused:
            config.load([override])
        assert "\n" not in str(refused.value)
    assert config.load([]).routing == RoutingSettings(mode=RoutingMode.affine, sticky=True, affinity_slack=4)


@pytest.fixture
async def replicas(tiny_qwen3: str) -> AsyncIterator[tuple[list[VLLMEngine], AsyncExitStack]]:
    """Two local engines of one model behind their HTTP servers; the exit stack stops the first (a kill)."""
    async with AsyncExitStack() as outer:
        first, second = AsyncExitStack(), AsyncExitStack()
        outer.push_async_callback(first.aclose)
        urls = []
        for stack in (first, second):
            engine = LocalEngine(tiny_qwen3, device="cpu", batch_window_s=0.02)
            urls.append(await stack.enter_async_context(serving(build_app(engine, api_key=API_KEY))))
        outer.push_async_callback(second.aclose)
        clients = [
            VLLMEngine(url, api_key=API_KEY, name=name)
            for url, name in zip(urls, ("one", "two"), strict=True)
        ]
        for client in clients:
            outer.push_async_callback(client.close)
        yield clients, first


async def test_two_replicas_keep_each_conversation_on_its_engine_and_survive_one_dying(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Path, replicas: tuple[list[VLLMEngine], AsyncExitStack]
) -> None:
    (one, two), kill_one = replicas
    secret = load_secret(tmp_path / "secret")
    seats = []
    for _ in range(8):
        seat_id = f"seat-{uuid.uuid4().hex[:10]}"
        seats.append((seat_id, (await open_seat(ledger, secret, seat_id=seat_id, agent="solver"))[1]))
    async with serve_gateway(ledger, renderer, one, replicas=[two], wait_s=10.0) as running:
        clients = [
            openai.AsyncOpenAI(base_url=f"{running.url}/s/{token}/v1", api_key="unused", max_retries=0)
            for _, token in seats
        ]
        conversations: list[list[Any]] = [
            [{"role": "user", "content": f"conversation {i}"}] for i in range(8)
        ]

        async def turn(i: int) -> None:
            answer = await clients[i].chat.completions.create(
                model="base", messages=conversations[i], max_tokens=6, seed=i
            )
            conversations[i] += [
                {"role": "assistant", "content": answer.choices[0].message.content or ""},
                {"role": "user", "content": "go on"},
            ]

        async def engines_of(turn_index: int) -> list[str]:
            recorded = [await turns(ledger, seat_id) for seat_id, _ in seats]
            return [next(r["engine"] for r in rs if r["turn_index"] == turn_index) for rs in recorded]

        for _ in range(3):
            await asyncio.gather(*(turn(i) for i in range(8)))
        first, second, third = [await engines_of(k) for k in range(3)]
        assert sorted(set(first)) == ["one", "two"] and first.count("one") >= 2  # the first turns spread
        assert second == first and third == first  # and each conversation stayed on its engine
        # Each later turn prefilled only what its engine had not computed for the conversation already.
        for seat_id, _ in seats:
            assert all(r.get("cached_tokens", 0) > 0 for r in await turns(ledger, seat_id) if r["turn_index"])
        await kill_one.aclose()  # replica one dies between turns
        await asyncio.gather(*(turn(i) for i in range(8)))
        assert await engines_of(3) == ["two"] * 8
    for seat_id, _ in seats:  # nothing lost, nothing doubled
        assert sorted(r["turn_index"] for r in await turns(ledger, seat_id)) == [0, 1, 2, 3]


def test_the_stack_runs_each_replica_on_a_port_of_its_own(tmp_path: Path) -> None:
    from rollout.config.overrides import setting_given
    from rollout.stack.embedded import Stack
    from rollout.stack.policy_engines import policy_engine_port
    from rollout_testing.stacks import isolated_overrides

    settings = config.load(
        [*isolated_overrides(tmp_path / "data", gateway=True), "services.engine.replicas=3"]
    )
    port = settings.services.gateway.engine_port
    stack = Stack(settings)
    ports = []
    for name in ("Engine", "Engine2", "Engine3"):
        process = stack.process(name)
        assert process is not None and process.command[3:5] == ("engine", "serve")
        ports.append(int(setting_given(process.command, "services.gateway.engine_port") or 0))
    assert ports == [port, port + 1, port + 2] and stack.process("Engine4") is None
    # A policy's engine on a model of its own is given a port above the replicas'.
    assert policy_engine_port(settings, "tiny-qwen3", []) > port + 2
