"""What a turn is admitted under: its run's state (a paused run holds turns, a stopped one refuses them for
good), and the bounds that keep one seat from starving the others (a default token budget, capped stop
strings, a cap on a seat's turns in flight, per-seat state bounded)."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout.activities.agent_loop import GatewayChat, SeatClosed, play
from rollout.contracts import Message
from rollout.engines.protocol import SampleRequest, SampleResult
from rollout.engines.scripted import ScriptedEngine
from rollout.gateway.seats import close_seat, load_secret, open_seat
from rollout.harness import End, Observation, RunContext, Task
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.streams import run_stream
from rollout.rendering import ModelRenderer
from tests.gatewayutil import BASH, serve_gateway, tool_loop_script, turns


async def seat_of_a_paused_run(ledger: Ledger, tmp_path: Path) -> tuple[str, str]:
    """A run made paused, and a seat of it: (the run, the seat's token)."""
    run = f"run-{uuid.uuid4().hex[:8]}"
    await ledger.append_one(
        run_stream(run),
        NewEvent("created", Kind.RUN_CREATED, {"run": run, "environment": "e", "settings": {"paused": True}}),
    )
    _, token = await open_seat(ledger, load_secret(tmp_path / "s"), seat_id=f"{run}/a", agent="a", run=run)
    return run, token


async def test_a_paused_run_holds_turns_then_answers_503_with_retry_after(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    run, token = await seat_of_a_paused_run(ledger, tmp_path)
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, wait_s=0.5) as paused,
        httpx.AsyncClient(base_url=paused.url) as http,
    ):
        held = await http.post(
            f"/s/{token}/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        )
        assert held.status_code == 503 and held.headers["retry-after"] == "1"
        assert "paused" in held.json()["error"]["message"]
        await ledger.append_one(
            run_stream(run),
            NewEvent("resume", Kind.SETTINGS_CHANGED, {"run": run, "changes": {"paused": False}}),
        )
        resumed = await http.post(
            f"/s/{token}/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        )
        assert resumed.status_code == 200


class _SaysAnything(Task):
    async def start(self, run: RunContext) -> Observation:
        return Observation("say anything")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=1.0)


async def test_a_gateway_that_stops_answers_its_held_turns_at_once(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    """A stopping gateway (`rollout down`, a restart) waited out every turn held at admission, up to its
    `wait_s`, and was killed meanwhile: now they get a 503 at once, which their clients retry."""
    _, token = await seat_of_a_paused_run(ledger, tmp_path)
    async with (
        serve_gateway(ledger, renderer, ScriptedEngine(renderer, tool_loop_script), wait_s=60) as running,
        httpx.AsyncClient(base_url=running.url, timeout=30) as http,
    ):
        body = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        held = asyncio.create_task(http.post(f"/s/{token}/v1/messages", json=body))
        await asyncio.sleep(0.5)
        assert not held.done(), "the paused run holds the turn"
        started = time.monotonic()
        running.gateway.admission.close()
        answer = await held
        assert time.monotonic() - started < 2
        assert answer.status_code == 503 and "stopping" in answer.json()["error"]["message"]


async def test_a_turn_held_while_its_run_is_paused_is_refused_for_good_once_the_run_stops(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    """A run stopped while paused would otherwise hold its last episodes' turns until a resume never sent."""
    run, token = await seat_of_a_paused_run(ledger, tmp_path)
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, wait_s=60) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=90) as http,
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        held = asyncio.create_task(http.post(f"/s/{token}/v1/chat/completions", json=body))
        await asyncio.sleep(0.3)
        assert not held.done(), "the paused run holds the turn"
        started = time.monotonic()
        await ledger.append_one(
            run_stream(run),
            NewEvent("stop", Kind.SETTINGS_CHANGED, {"run": run, "changes": {"stopped": True}}),
        )
        refused = await held
        assert time.monotonic() - started < 10, "refused when the run stopped, not when the wait ran out"
        assert refused.status_code == 410, refused.text
        assert "was stopped" in refused.json()["error"]["message"]
        # The episode's loop takes that as the end of its seat: a failure no retry would change.
        model = GatewayChat(f"{gateway.url}/s/{token}/v1", token, outage_window_s=5)
        context = RunContext(run=run, episode="e", seat=f"{run}/a", attempt=1, parameters={})
        with pytest.raises(SeatClosed) as closed:
            await play(_SaysAnything(), context, model, max_turns=2)
        await model.close()
        assert closed.value.failure.kind == "SeatClosed" and closed.value.failure.deterministic
        assert f"run {run} was stopped" in closed.value.failure.reason


class BudgetsSeen(ScriptedEngine):
    """A scripted engine that keeps the token budget each turn was sampled with."""

    def __init__(self, renderer: ModelRenderer, **kwargs: Any) -> None:
        super().__init__(renderer, tool_loop_script, **kwargs)
        self.budgets: list[int] = []

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.budgets.append(request.max_tokens)
        return await super().sample(request)


async def test_a_turn_that_names_no_budget_gets_the_default_one(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str]
) -> None:
    """Without the default an agent leaving `max_tokens` out would sample to the end of the context."""
    _, token = seat
    engine = BudgetsSeen(renderer)
    async with (
        serve_gateway(ledger, renderer, engine, max_context=4096, default_max_tokens=100) as running,
        httpx.AsyncClient(base_url=f"{running.url}/s/{token}/v1") as http,
    ):
        for n, budget in enumerate([None, 3000, 50]):
            body: dict[str, Any] = {"messages": [{"role": "user", "content": f"question {n}"}]}
            if budget is not None:
                body["max_tokens"] = budget
            assert (await http.post("/chat/completions", json=body)).status_code == 200
        answered = await http.post("/responses", json={"input": "question 3"})
        assert answered.status_code == 200
    # none named: the default; one named is kept, above the default too (the room left in the context caps it)
    assert engine.budgets[0] == 100 and engine.budgets[2] == 50 and engine.budgets[3] == 100
    assert 100 < engine.budgets[1] <= 3000


async def test_a_thousand_stop_strings_are_a_400_naming_the_field(
    ledger: Ledger, renderer: ModelRenderer, seat: tuple[str, str]
) -> None:
    """Each stop string is matched against every reply: their number and length are capped."""
    _, token = seat
    stops = [f"stop {n}" for n in range(1000)]
    user = [{"role": "user", "content": "hi"}]
    async with (
        serve_gateway(ledger, renderer, ScriptedEngine(renderer, tool_loop_script)) as running,
        httpx.AsyncClient(base_url=f"{running.url}/s/{token}/v1") as http,
    ):
        chat = await http.post("/chat/completions", json={"messages": user, "stop": stops})
        anthropic_ = await http.post(
            "/messages", json={"messages": user, "max_tokens": 8, "stop_sequences": stops}
        )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "stop"
    assert anthropic_.status_code == 400
    assert anthropic_.json()["error"]["message"] == "'stop_sequences' must hold at most 16 items"


async def test_a_seat_flooding_the_gateway_gets_429s_while_other_seats_are_answered(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    """50 turns at once from one seat: its limit's worth are sampled and the rest get 429 with Retry-After;
    a replay of its recorded turn is still answered, and another seat's turns take about as long as idle."""
    secret = load_secret(tmp_path / "secret")
    _, flooder = await open_seat(ledger, secret, seat_id=f"flood-{uuid.uuid4().hex[:8]}", agent="a")
    _, other = await open_seat(ledger, secret, seat_id=f"other-{uuid.uuid4().hex[:8]}", agent="a")
    engine = ScriptedEngine(renderer, tool_loop_script, think_s=1.0)
    async with (
        serve_gateway(ledger, renderer, engine, max_turns_in_flight_per_seat=4) as running,
        httpx.AsyncClient(base_url=running.url, timeout=30) as http,
    ):

        async def ask(token: str, text: str) -> httpx.Response:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 16}
            return await http.post(f"/s/{token}/v1/chat/completions", json=body)

        async def timed(token: str, text: str) -> float:
            started = time.perf_counter()
            assert (await ask(token, text)).status_code == 200
            return time.perf_counter() - started

        assert (await ask(flooder, "recorded")).status_code == 200
        idle = sorted(await asyncio.gather(*[timed(other, f"idle {n}") for n in range(3)]))[1]
        flood = [asyncio.create_task(ask(flooder, f"flood {n}")) for n in range(50)]
        await asyncio.sleep(0.3)  # the flood is in: its first four are being sampled
        replay = await ask(flooder, "recorded")
        loaded = sorted(await asyncio.gather(*[timed(other, f"loaded {n}") for n in range(3)]))[1]
        answers = await asyncio.gather(*flood)
    assert replay.status_code == 200, "a replay is answered whatever the seat has in flight"
    assert sorted(a.status_code for a in answers) == [200] * 4 + [429] * 46
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert loaded < 2 * idle, f"another seat's p50 went from {idle:.2f} s idle to {loaded:.2f} s"


async def test_per_seat_state_is_bounded_and_dropped_when_the_seat_closes(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    secret = load_secret(tmp_path / "secret")
    seats = [
        await open_seat(ledger, secret, seat_id=f"lru{n}-{uuid.uuid4().hex[:8]}", agent="a") for n in range(3)
    ]
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, max_seats_kept=2) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        first = [{"role": "user", "content": "list the files"}]

        async def ask(token: str, messages: list[dict[str, Any]]) -> httpx.Response:
            body = {"messages": messages, "tools": [BASH]}
            return await http.post(f"/s/{token}/v1/chat/completions", json=body)

        replies = [(await ask(token, first)).json()["choices"][0]["message"] for _, token in seats]
        kept = running.gateway.seats
        assert len(kept) == 2 and seats[0][0].seat_id not in kept, "the least recently used seat is let go"
        # A seat let go has its segment rebuilt from its stream: its next turn still extends it.
        (seat, token), call = seats[0], replies[0]
        result = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "README.md"}
        assert (await ask(token, [*first, call, result])).status_code == 200
        records = await turns(ledger, seat.seat_id)
        assert records[1]["segment_id"] == records[0]["segment_id"] and records[1]["prompt_prefix_len"] > 0
        await close_seat(ledger, seats[1][0].seat_id)
        assert (await ask(seats[1][1], first)).status_code == 410
        assert seats[1][0].seat_id not in kept, "a closed seat's state is dropped"


async def _timed_with_the_loops_gaps(
    request: Coroutine[Any, Any, httpx.Response],
) -> tuple[httpx.Response, float, list[float]]:
    """`request`'s answer, how long it took, and the gaps between the event loop's ticks meanwhile (a tick
    every 2 ms asked for): a gap as long as the request means the loop stood still for it."""
    gaps: list[float] = []
    turning = True

    async def ticked() -> None:
        last = time.perf_counter()
        while turning:
            await asyncio.sleep(0.002)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    gc.freeze()  # as the gateway's process does once started (rollout.gateway.assembly)
    ticker = asyncio.create_task(ticked())
    started = time.perf_counter()
    answer = await request
    took = time.perf_counter() - started
    turning = False
    await ticker
    gc.unfreeze()
    return answer, took, gaps


async def test_a_long_observation_renders_while_the_other_seats_go_on(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    """A turn carrying a 600 kB observation takes its render (hundreds of milliseconds) off the event loop:
    the gateway's loop keeps turning meanwhile, so every other seat's turn goes on."""
    secret = load_secret(tmp_path / "secret")
    _, token = await open_seat(ledger, secret, seat_id=f"long-{uuid.uuid4().hex[:8]}", agent="a")
    words = ("alpha", "beta", "gamma", "delta", "x1", "zz9")
    observation = " ".join(words[(n * 7) % 6] + str(n % 97) for n in range(100_000))
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, max_context=4096) as running,
        httpx.AsyncClient(base_url=running.url, timeout=60) as http,
    ):

        async def ask(text: str) -> httpx.Response:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 16}
            return await http.post(f"/s/{token}/v1/chat/completions", json=body)

        assert (await ask("warm the renderer up")).status_code == 200
        answer, took, gaps = await _timed_with_the_loops_gaps(ask(observation))
    assert (
        answer.status_code == 400 and "the model's context is 4096" in answer.text
    )  # rendered, then refused
    assert took > 0.15, f"the render took {took:.3f} s: too short to show anything"
    assert max(gaps) < took / 3, f"the loop stalled {max(gaps):.3f} s of the turn's {took:.3f} s"


async def test_a_token_count_renders_off_the_loop_and_counts_against_its_seats_cap(
    ledger: Ledger, renderer: ModelRenderer, tmp_path: Any
) -> None:
    """Anthropic's `count_tokens` renders a whole prompt, as a turn does: a 600 kB one renders off the event
    loop, and a seat's counts are turns in flight under its cap, so one seat cannot queue the renderer up."""
    secret = load_secret(tmp_path / "secret")
    _, token = await open_seat(ledger, secret, seat_id=f"count-{uuid.uuid4().hex[:8]}", agent="a")
    words = ("alpha", "beta", "gamma", "delta", "x1", "zz9")
    observation = " ".join(words[(n * 7) % 6] + str(n % 97) for n in range(100_000))
    engine = ScriptedEngine(renderer, tool_loop_script)
    async with (
        serve_gateway(ledger, renderer, engine, max_turns_in_flight_per_seat=2) as running,
        httpx.AsyncClient(base_url=running.url, timeout=60) as http,
    ):

        async def count(text: str) -> httpx.Response:
            body = {"model": "base", "messages": [{"role": "user", "content": text}]}
            return await http.post(f"/s/{token}/v1/messages/count_tokens", json=body)

        assert (await count("warm the renderer up")).status_code == 200
        answer, took, gaps = await _timed_with_the_loops_gaps(count(observation))
        assert answer.status_code == 200 and answer.json()["input_tokens"] > 100_000
        assert took > 0.15, f"the count took {took:.3f} s: too short to show anything"
        assert max(gaps) < took / 3, f"the loop stalled {max(gaps):.3f} s of the count's {took:.3f} s"

        # Six long counts at once: the first two render (one after the other), the rest arrive meanwhile.
        flood = await asyncio.gather(*[count(f"{n} {observation}") for n in range(6)])
    assert sorted(a.status_code for a in flood) == [200] * 2 + [429] * 4, [a.text[:200] for a in flood]
    refused = next(a for a in flood if a.status_code == 429)
    assert refused.json()["error"]["type"] == "rate_limit_error" and refused.headers["retry-after"] == "1"
