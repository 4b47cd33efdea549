"""A turn sampled but not yet recorded: what `Gateway.sample` hands back and a live turn settles into.

Contract: `Sampled` carries the request, the seat, the turn the client is sent, the `RecordedTurn` that
recording it appends, and the segment head it extends (None for an external model's turn, which has no token
ids). It is a value; recording it is the gateway's. `sampled_turn` makes one from an engine's result: the ids
cut where a stop string completes (engines stop on ids, clients on text), parsed with the prompt's renderer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from rollout.engines.protocol import SampleResult
from rollout.gateway.admission import Admitted, EngineSlot
from rollout.gateway.prompts import Prompt
from rollout.gateway.requests import ChatRequest, Turn
from rollout.gateway.seats import Seat
from rollout.gateway.segments import Head
from rollout.gateway.stops import cut_at_stop
from rollout.ledger.payloads import RecordedTurn, SampledTurn
from rollout.rendering import ModelRenderer


@dataclass(frozen=True)
class Sampled:
    """A turn sampled but not yet recorded (the streaming path records it at the end of the stream)."""

    request: ChatRequest
    seat: Seat
    turn: Turn
    record: RecordedTurn  # what `record` appends as the turn's `TurnRecorded`
    head: Head | None  # None for an external model's turn: it has no token ids to extend


def sampled_turn(
    seat: Seat,
    request: ChatRequest,
    rendered: Prompt,
    result: SampleResult,
    slot: EngineSlot,
    admitted: Admitted,
) -> Sampled:
    """The turn `result` makes for `seat`, sampled on `slot`: cut at a stop string, parsed with the prompt's
    renderer, with its record and the segment's new head."""
    tools = list(request.tools)
    prompt, segment_id, prefix = rendered.ids, rendered.segment_id, rendered.prefix
    result, stop_sequence = _cut_at_stop_strings(rendered.renderer, result, request.params.stop)
    parsed = rendered.renderer.parse(list(result.completion_ids), tools, prompt)
    finish = "tool_calls" if parsed.message.tool_calls else result.finish_reason
    turn = Turn(
        reply=parsed.message,
        finish_reason=finish,
        prompt_tokens=len(prompt),
        completion_tokens=len(result.completion_ids),
        turn_index=request.turn_index,
        model=slot.checkpoint,
        stop_sequence=stop_sequence,
        cached_tokens=result.cached_tokens,
    )
    done = time.perf_counter()
    record = SampledTurn(
        seat=seat.seat_id,
        run=seat.run,
        episode=seat.episode,
        agent=seat.agent,
        policy=seat.policy,
        turn_index=request.turn_index,
        fingerprint=request.fingerprint,
        segment_id=segment_id,
        prompt_prefix_len=prefix,
        prompt_ids_delta=tuple(prompt[prefix:]),
        completion_ids=tuple(result.completion_ids),
        completion_logprobs=tuple(result.logprobs),
        checkpoint=slot.checkpoint,
        checkpoint_version=slot.version,
        engine=slot.engine.name,
        admitted_newest=admitted.newest,
        admitted_max_lag=admitted.max_lag,
        finish_reason=finish,
        stop_sequence=stop_sequence,
        reply=parsed.message.model_dump(mode="json"),
        parse_failures=tuple(parsed.parse_failures),
        n_messages=len(request.messages),
        messages_sha=request.messages_sha,
        tools_sha=request.tools_sha,
        timings={
            "render_s": rendered.rendered_at - rendered.started,
            "sample_s": done - rendered.rendered_at,
            **result.timings,
        },
        opening=rendered.opening,
        cached_tokens=result.cached_tokens,
    )
    head = Head(
        segment_id=segment_id,
        seq=0,
        n_messages=len(request.messages),
        messages_sha=request.messages_sha,
        tools_sha=request.tools_sha,
        reply=parsed.message,
        prompt_ids=tuple(prompt),
        completion_ids=result.completion_ids,
    )
    return Sampled(request, seat, turn, record, head)


def _cut_at_stop_strings(
    renderer: ModelRenderer, result: SampleResult, stops: tuple[str, ...]
) -> tuple[SampleResult, str | None]:
    """Keep the sampled ids up to the token that completes a stop string (engines stop on ids, clients on
    text)."""
    cut = cut_at_stop(renderer.tokenizer.decode, result.completion_ids, stops)
    if cut is None:
        return result, None
    k, hit = cut
    return replace(
        result, completion_ids=result.completion_ids[:k], logprobs=result.logprobs[:k], finish_reason="stop"
    ), hit
