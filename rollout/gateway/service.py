"""The gateway's core: one turn, whatever the dialect — replay or render, admit, sample, parse, record.

Contract:
- Every turn served is recorded once on the seat's stream (`seat/{id}`) as `TurnRecorded`, keyed
  `turn/{index}/{fingerprint}`, before the response completes. The record holds the exact prompt ids (as a
  delta on the segment's earlier ids), the sampled ids, one behaviour logprob per sampled id, the checkpoint
  and engine that sampled them, the segment id, the parsed reply, parse failures and timings.
- The same request at the same turn index gets the recorded reply, not a new sample (replay). Two identical
  requests racing each other both get the one reply that was recorded first.
- A seat whose policy names an external model (LiteLLM) is answered by that model; its turn is recorded as
  text with `external: true, trainable: false` (no token ids), and replays like any other. Which model answers
  a seat is rollout.gateway.externals' to say (one configured for its policy, or one its run recorded at an
  API base the gateway was configured with).
- A turn the client abandoned mid-stream is recorded as aborted under a key of its own (never replayed, never
  trained), with the ids and logprobs sampled until the engine was stopped.
- `stream` serves a streaming request: a replay (`Turn`) or an external model's turn (`Sampled`) whole, and a
  sampled turn as a `LiveTurn` (rollout.gateway.live) that hands out the reply as the engine samples it and is
  recorded by the caller once it ends. A live turn's prompt, admission and engine retries are those of
  `sample` (an engine is retried only until it produced a first token); its record is the one `sample` would
  make of the same tokens, but for the reply, which is what the client was sent.
- Prompt ids come from the segment rules (rollout.gateway.prompts), rendered with the seat's model
  (rollout.gateway.renderers: its policy's base model when its run names one); the turn is cut, parsed and
  stopped with the same model's tokenizer. A prompt that does not fit the model's context is a `BadRequest`. A
  turn asking for top_p 0 is sampled greedily (temperature 0, top_p 1).
- A turn's token budget is the request's, capped by its run's `max_tokens` setting and by the room left in the
  context; a request that names none, on a run that sets none, gets `default_max_tokens`.
- `prepare` renders a turn for a seat ahead of its checks, so the caller can render while the seat is looked
  up (both are on every turn's path); `sample` and `stream` use a `Prepared` made for the same seat, and
  render again otherwise. A prepared render that failed raises its `BadRequest` only once it is used.
- `count_tokens` (Anthropic's token count) renders like a turn and is held to the same per-seat cap.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Mapping
from dataclasses import replace
from typing import cast

from rollout.contracts import Message
from rollout.engines.external import ExternalModel
from rollout.engines.protocol import (
    Engine,
    EngineUnavailable,
    SampleChunk,
    SampleRequest,
    stream_sample,
)
from rollout.gateway.admission import Admission, Admitted, EngineSlot
from rollout.gateway.affinity import Conversation
from rollout.gateway.externals import ExternalModels
from rollout.gateway.live import LiveTurn, SettledText
from rollout.gateway.prompts import Prepared, Prompt, counted_off_the_loop, rendered_off_the_loop
from rollout.gateway.renderers import Renderers
from rollout.gateway.requests import BadRequest, ChatRequest, FinishReason, Turn
from rollout.gateway.sampled import Sampled, sampled_turn
from rollout.gateway.seats import Seat
from rollout.gateway.seatstate import (
    MAX_SEATS_KEPT,
    MAX_TURNS_IN_FLIGHT_PER_SEAT,
    Release,
    SeatStates,
    TurnsInFlight,
)
from rollout.gateway.segments import Head, advance
from rollout.ledger import KeyConflictError, Kind, Ledger, NewEvent, RecordedEvent
from rollout.ledger.payloads import ExternalTurn, SampledTurn, turn_recorded
from rollout.rendering import ModelRenderer

DEFAULT_MAX_TOKENS = 4096  # services.gateway.default_max_tokens


class NotLookedUp:
    """The caller has not looked for this turn's recorded event."""


NOT_LOOKED_UP = NotLookedUp()


class Gateway:
    def __init__(
        self,
        ledger: Ledger,
        renderer: ModelRenderer,
        admission: Admission,
        *,
        model: str = "",
        renderers: Callable[[str], ModelRenderer] | None = None,
        max_context: int = 8192,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        max_turns_in_flight_per_seat: int = MAX_TURNS_IN_FLIGHT_PER_SEAT,
        max_seats_kept: int = MAX_SEATS_KEPT,
        externals: Mapping[str, ExternalModel] | None = None,
        external_api_bases: Collection[str] = (),
    ) -> None:
        self.ledger = ledger
        self.externals = ExternalModels(admission, externals, external_api_bases)
        self.renderer = renderer  # the gateway's own model's
        # Each seat's: its policy's base model's, when its run's policies are on several.
        self.renderers = Renderers(admission, renderer, model=model, build=renderers)
        self.admission = admission
        self.max_context = max_context
        self.default_max_tokens = default_max_tokens
        self.seats = SeatStates(max_seats_kept)
        self.in_flight = TurnsInFlight(max_turns_in_flight_per_seat)

    # ---- the turn
    # -------------------------------------------------------------------------------------------

    async def complete(
        self,
        seat: Seat,
        request: ChatRequest,
        *,
        recorded: RecordedEvent | NotLookedUp | None = NOT_LOOKED_UP,
        prepared: Prepared | None = None,
    ) -> Turn:
        """Serve a turn and record it before returning."""
        outcome = await self.sample(seat, request, recorded=recorded, prepared=prepared)
        if isinstance(outcome, Turn):
            return outcome
        return await self.record(outcome)

    async def prepare(self, seat: Seat, request: ChatRequest) -> Prepared | None:
        if self.in_flight.full(seat.seat_id):
            return None  # the turn is refused unless it is a replay, which needs no prompt: render nothing
        try:
            return Prepared(seat.seat_id, await self._render(seat, request))
        except BadRequest as bad:
            return Prepared(seat.seat_id, bad)
        except EngineUnavailable:
            return None  # no engine serves the seat's model (yet): the turn renders again, and says so

    async def count_tokens(self, seat: Seat, request: ChatRequest) -> int:
        """The tokens `request`'s whole prompt renders to for `seat`'s model. A count renders as a turn does,
        so it is one of the seat's turns in flight meanwhile: past the cap it raises `SeatBusy`."""
        release = self.in_flight.enter(seat.seat_id)
        try:
            return await counted_off_the_loop(await self.renderers.for_seat(seat), request)
        finally:
            release()

    async def sample(
        self,
        seat: Seat,
        request: ChatRequest,
        *,
        recorded: RecordedEvent | NotLookedUp | None = NOT_LOOKED_UP,
        prepared: Prepared | None = None,
    ) -> Turn | Sampled:
        """A replayed `Turn`, or a fresh sample to `record` (or `record_aborted`).

        `recorded` is the event already under this turn's key when the caller looked it up with the seat
        (`resolve_for_turn`); otherwise the gateway looks it up itself.
        """
        replayed = await self._replayed(seat, request, recorded)
        if replayed is not None:
            return replayed
        release = self.in_flight.enter(seat.seat_id)
        try:
            external = await self.externals.for_seat(seat)
            if external is not None:
                return await self._sample_external(seat, request, external)
            prompt = await self._prompt(seat, request, prepared)
            result, slot, admitted, ended = await self._on_admitted_engine(
                seat, request, prompt, lambda engine, sample_request: engine.sample(sample_request)
            )
            ended()
            return sampled_turn(seat, request, prompt, result, slot, admitted)
        finally:
            release()

    async def stream(
        self,
        seat: Seat,
        request: ChatRequest,
        *,
        recorded: RecordedEvent | NotLookedUp | None = NOT_LOOKED_UP,
        prepared: Prepared | None = None,
    ) -> Turn | Sampled | LiveTurn:
        """A replayed `Turn`, an external model's `Sampled`, or a `LiveTurn` whose engine has sampled a
        token."""
        replayed = await self._replayed(seat, request, recorded)
        if replayed is not None:
            return replayed
        release = self.in_flight.enter(seat.seat_id)
        try:
            external = await self.externals.for_seat(seat)
            if external is not None:
                try:
                    return await self._sample_external(seat, request, external)
                finally:
                    release()
            return await self._live(seat, request, prepared, release)
        except BaseException:
            release()
            raise

    async def _live(
        self, seat: Seat, request: ChatRequest, prepared: Prepared | None, release: Release
    ) -> LiveTurn:
        prompt = await self._prompt(seat, request, prepared)

        async def first_token(
            engine: Engine, sample_request: SampleRequest
        ) -> tuple[SampleChunk, AsyncGenerator[SampleChunk]]:
            chunks = stream_sample(engine, sample_request)
            try:
                return await anext(chunks), chunks
            except BaseException:
                await chunks.aclose()
                raise

        (first, chunks), slot, admitted, ended = await self._on_admitted_engine(
            seat, request, prompt, first_token
        )

        def on_end() -> None:
            ended()  # the engine's turn in flight, for routing
            release()  # the seat's

        return LiveTurn(
            first=first,
            chunks=chunks,
            text=SettledText(prompt.renderer, list(request.tools), prompt.ids, request.params.stop),
            model=slot.checkpoint,
            prompt_tokens=len(prompt.ids),
            build=lambda result: sampled_turn(seat, request, prompt, result, slot, admitted),
            on_end=on_end,
        )

    async def _replayed(
        self, seat: Seat, request: ChatRequest, recorded: RecordedEvent | NotLookedUp | None
    ) -> Turn | None:
        if not request.messages:
            raise BadRequest("at least one message is required", field="messages")
        if isinstance(recorded, NotLookedUp):
            recorded = await self.ledger.find(seat.stream, self.turn_key(request))
        return None if recorded is None else self.replayed(recorded)

    async def _prompt(self, seat: Seat, request: ChatRequest, prepared: Prepared | None) -> Prompt:
        if prepared is None or prepared.seat_id != seat.seat_id:
            return await self._render(seat, request)
        if isinstance(prepared.prompt, BadRequest):
            raise prepared.prompt
        return prepared.prompt

    async def _render(self, seat: Seat, request: ChatRequest) -> Prompt:
        renderer = await self.renderers.for_seat(seat)
        heads = await self.heads(seat)
        return await rendered_off_the_loop(renderer, heads, seat.seat_id, request, self.max_context)

    async def _sample_external(self, seat: Seat, request: ChatRequest, external: ExternalModel) -> Sampled:
        """A turn of a model the platform does not train: recorded as text, marked never to be trained."""
        started = time.perf_counter()
        reply = await external.complete(list(request.messages), list(request.tools), request.params)
        finish = (
            "tool_calls"
            if reply.message.tool_calls
            else ("length" if reply.finish_reason == "length" else "stop")
        )
        turn = Turn(
            reply=reply.message,
            finish_reason=finish,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            turn_index=request.turn_index,
            model=external.model,
        )
        record = ExternalTurn(
            seat=seat.seat_id,
            run=seat.run,
            episode=seat.episode,
            agent=seat.agent,
            policy=seat.policy,
            turn_index=request.turn_index,
            fingerprint=request.fingerprint,
            model=external.model,
            finish_reason=finish,
            reply=reply.message.model_dump(mode="json"),
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            n_messages=len(request.messages),
            messages_sha=request.messages_sha,
            tools_sha=request.tools_sha,
            timings={"sample_s": time.perf_counter() - started},
        )
        return Sampled(request, seat, turn, record, None)

    async def _on_admitted_engine[T](
        self,
        seat: Seat,
        request: ChatRequest,
        prompt: Prompt,
        call: Callable[[Engine, SampleRequest], Awaitable[T]],
    ) -> tuple[T, EngineSlot, Admitted, Callable[[], None]]:
        """`call` (a sample, or a stream's first token) on the first admitted engine that answers, and what
        ends the turn's count on that engine (the caller calls it when the turn is over). While none answers
        (an engine restarting, a checkpoint being reloaded) the turn is held and admission is asked again, up
        to its wait."""
        conversation = Conversation(segment=prompt.segment_id, seat=seat.seat_id)
        deadline = time.monotonic() + self.admission.wait_s
        # top_p 0 keeps only the likeliest token: that is greedy, which every engine takes (vLLM refuses top_p
        # 0).
        greedy = request.params.top_p <= 0
        temperature = 0.0 if greedy else request.params.temperature
        top_p = 1.0 if greedy else request.params.top_p
        last_error: EngineUnavailable | None = None
        fresh = False
        while True:
            admitted = await self.admission.candidates(
                seat, fresh=fresh, deadline=deadline, conversation=conversation
            )
            cap = min(prompt.max_tokens, admitted.max_tokens or prompt.max_tokens)
            if request.params.max_tokens is None and admitted.max_tokens is None:
                cap = min(cap, self.default_max_tokens)  # else one request could sample to the context's end
            for slot in admitted.slots:
                sample_request = SampleRequest(
                    prompt_ids=tuple(prompt.ids),
                    max_tokens=cap,
                    model=slot.checkpoint,
                    temperature=temperature if admitted.temperature is None else admitted.temperature,
                    top_p=top_p,
                    stop_token_ids=prompt.renderer.stop_token_ids,
                    seed=request.params.seed,
                )
                ended = self.admission.begin(slot)
                try:
                    answer = await call(slot.engine, sample_request)
                except EngineUnavailable as error:
                    ended()
                    last_error = error
                    continue
                except BaseException:
                    ended()
                    raise
                self.admission.served(conversation, slot)
                return answer, slot, admitted, ended
            if time.monotonic() >= deadline:
                raise last_error or EngineUnavailable("no engine could take the turn")
            fresh = True
            await asyncio.sleep(self.admission.poll_s)

    async def record(self, sampled: Sampled) -> Turn:
        """Append the turn (acknowledged before the response completes); a racing twin's record wins."""
        key = self.turn_key(sampled.request)
        try:
            event = await self.ledger.append_one(
                sampled.seat.stream, NewEvent(key, Kind.TURN_RECORDED, sampled.record.to_payload())
            )
        except KeyConflictError:
            existing = await self.ledger.find(sampled.seat.stream, key)
            assert existing is not None
            return self.replayed(existing)
        if sampled.head is not None:
            head = Head(**{**sampled.head.__dict__, "seq": event.seq})
            async with self.seats.use(sampled.seat.seat_id) as state:
                # Heads not kept (never loaded, or forgotten since the render) are rebuilt from the stream,
                # this turn included, on the seat's next turn.
                if state.heads is not None:
                    state.heads = advance(state.heads, head)
        return sampled.turn

    async def record_aborted(self, sampled: Sampled, reason: str) -> None:
        payload = replace(sampled.record, aborted=reason).to_payload()
        key = f"{self.turn_key(sampled.request)}/aborted/{uuid.uuid4().hex[:8]}"
        await self.ledger.append_one(sampled.seat.stream, NewEvent(key, Kind.TURN_RECORDED, payload))

    # ---- state
    # ----------------------------------------------------------------------------------------------

    @staticmethod
    def turn_key(request: ChatRequest) -> str:
        return f"turn/{request.turn_index}/{request.fingerprint[:32]}"

    def replayed(self, event: RecordedEvent) -> Turn:
        record = turn_recorded(event.payload)
        reply = Message.model_validate(record.reply)
        finish = cast(FinishReason, record.finish_reason)  # recorded by this gateway, from a FinishReason
        if isinstance(record, ExternalTurn):
            return Turn(
                reply=reply,
                finish_reason=finish,
                prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens,
                turn_index=record.turn_index,
                model=record.model,
                replayed=True,
            )
        return Turn(
            reply=reply,
            finish_reason=finish,
            prompt_tokens=record.prompt_prefix_len + len(record.prompt_ids_delta),
            completion_tokens=len(record.completion_ids),
            turn_index=record.turn_index,
            model=record.checkpoint,
            stop_sequence=record.stop_sequence,
            replayed=True,
            cached_tokens=record.cached_tokens,
        )

    async def heads(self, seat: Seat) -> list[Head]:
        """The seat's open segments: from memory, or rebuilt from its stream (after a restart, or once the
        seat was forgotten)."""
        async with self.seats.use(seat.seat_id) as state:
            if state.heads is None:
                state.heads = await self._load_heads(seat)
            return list(state.heads)

    def forget(self, seat_id: str) -> None:
        """Drop what is kept in memory for a seat (a closed one: it takes no more turns)."""
        self.seats.drop(seat_id)

    async def _load_heads(self, seat: Seat) -> list[Head]:
        full: dict[str, tuple[int, ...]] = {}  # segment id -> its ids so far (prompt + completion)
        heads: list[Head] = []
        after = 0
        while events := await self.ledger.read(seat.stream, after=after):
            after = events[-1].seq
            for event in events:
                if event.kind != Kind.TURN_RECORDED:
                    continue
                turn = turn_recorded(event.payload)
                if not isinstance(turn, SampledTurn) or turn.aborted:
                    continue
                prompt = full.get(turn.segment_id, ())[: turn.prompt_prefix_len] + turn.prompt_ids_delta
                completion = turn.completion_ids
                full[turn.segment_id] = prompt + completion
                heads = advance(
                    heads,
                    Head(
                        segment_id=turn.segment_id,
                        seq=event.seq,
                        n_messages=turn.n_messages,
                        messages_sha=turn.messages_sha,
                        tools_sha=turn.tools_sha,
                        reply=Message.model_validate(turn.reply),
                        prompt_ids=prompt,
                        completion_ids=completion,
                    ),
                )
        return heads
