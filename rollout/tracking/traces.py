"""A run's traces, built from the ledger: each ended episode's spans and each step's, as entries a feed
exports once.

Contract:
- `episode_spans(ledger, run, ended, ended_at)` is one ended episode's trace (`episode_trace_id`): the root
  `episode` (from its first seat's opening to when the runner recorded its end and closed its seats; an
  abandoned episode's carries its failure as the error), one `seat AGENT` under it per agent (the seat's
  `SeatOpened` to its `SeatClosed`), one `turn N` under each seat per recorded turn (ending when the
  gateway recorded it, starting its render and sample time earlier), and under each sampled turn `gateway
  render` then `engine sample` (the engine's own timings, queued and compute, as attributes). Token counts
  follow OpenTelemetry's GenAI names (`gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
  `gen_ai.usage.cache_read.input_tokens`: the prompt tokens the engine's prefix cache held).
- `step_spans(ledger, run, policy, step)` is one complete step's trace (`step_trace_id`): the root `step N`
  (its batch recorded to the last engine that took its checkpoint), `train` (batch to checkpoint), one
  `bridge FORMAT` per conversion recorded, and `serving` (its first `ServingTarget` to the last engine's
  first `ServingAck` naming the checkpoint) with one `serve ENGINE` per engine. A skipped step (every group
  tied) is its root alone.
- `TraceReader(given).read(ledger, held, release=)` gives the entries (rollout.tracking.entries) of streams
  `traces/episodes` (step: the event's seq on `run/{run}/episodes`; an attempt's abandonment is an entry
  without spans, so the position passes it) and `traces/steps` (`traces/steps/POLICY` for each policy of a run
  with several; step: the step), only those above `held` (the backend's positions), at most
  `EVENTS_PER_READ` events of the episodes stream a call (`caught_up` says whether that was all). A step's
  trace waits until the policy's next step is complete (its engines took its checkpoint long before), or
  `release` (the run is over).
- Every payload is read as a record; one that does not parse costs its own span, never the trace. A turn's
  timings are drawn only when they are numbers from 0 to `MAX_TURN_S` (0 otherwise): no writer's value can
  stop the feed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta

from rollout.ledger import Kind, Ledger
from rollout.ledger.payloads import EpisodeEnded, ExternalTurn, SampledTurn, episode_ended, turn_recorded
from rollout.ledger.queries import first_served, read_all, run_progress, serving_targets_of
from rollout.ledger.records import records_of
from rollout.ledger.streams import policy_bridges_stream, run_episodes_stream, seat_stream
from rollout.records.checkpoints import CheckpointConverted
from rollout.records.seats import SeatOpened
from rollout.records.serving import ServingTarget
from rollout.tracking.entries import Entry, stream_part
from rollout.tracking.spans import AttributeValue, Span, episode_trace_id, span, step_trace_id
from rollout.tracking.step_metrics import RecordedStep, recorded_steps
from rollout.workflows.names import run_policy
from rollout.workflows.tracking_types import TrackingInput

EPISODES_STREAM = "traces/episodes"
MAX_TURN_S = 86_400.0  # a turn's timing past a day is no timing
ENGINE_TIMINGS = 8  # of a turn's recorded timings, at most this many become attributes
EVENTS_PER_READ = 200  # of the episodes stream, each poll: bounds what one poll builds and holds


def steps_stream(policy: str, policies: list[str]) -> str:
    return "traces/steps" if len(policies) == 1 else f"traces/steps/{stream_part(policy)}"


async def episode_spans(ledger: Ledger, run: str, ended: EpisodeEnded, ended_at: datetime) -> list[Span]:
    trace = episode_trace_id(run, ended.episode)
    spans: list[Span] = []
    starts = [ended_at]
    for agent, seat in sorted(ended.seats.items()):
        seat_path = f"seat/{agent}"
        events = await read_all(ledger, seat_stream(seat))
        opened = next((e for e in events if e.kind == Kind.SEAT_OPENED), None)
        closed = next((e for e in events if e.kind == Kind.SEAT_CLOSED), None)
        turns = 0
        seat_start = opened.recorded_at if opened is not None else ended_at
        for event in events:
            if event.kind != Kind.TURN_RECORDED:
                continue
            try:
                turn = turn_recorded(event.payload)
            except ValueError:
                continue
            turns += 1
            turn_spans = _turn_spans(trace, seat_path, turn, event.recorded_at)
            seat_start = min(seat_start, turn_spans[0].start)
            spans += turn_spans
        opening = records_of([opened], SeatOpened) if opened is not None else []
        policy = opening[0].policy if opening else None
        spans.append(
            span(
                trace,
                seat_path,
                f"seat {agent}",
                seat_start,
                closed.recorded_at if closed is not None else ended_at,
                parent="episode",
                attributes={
                    "rollout.seat": seat,
                    "rollout.agent": agent,
                    "rollout.policy": policy if isinstance(policy, str) else None,
                    "rollout.reward": ended.rewards.get(agent),
                    "rollout.turns": turns,
                },
            )
        )
        starts.append(seat_start)
    error = None
    if not ended.finished:
        error = (
            f"{ended.failure.kind}: {ended.failure.reason}" if ended.failure else ended.error or "abandoned"
        )
    root = span(
        trace,
        "episode",
        "episode",
        min(starts),
        max([ended_at, *(s.end for s in spans)]),  # its seats are closed once its end is recorded
        parent=None,
        attributes={
            "rollout.run": run,
            "rollout.episode": ended.episode,
            "rollout.group": ended.group,
            "rollout.environment": ended.environment or None,
            "rollout.finished": ended.finished,
            **{f"rollout.reward.{agent}": reward for agent, reward in ended.rewards.items()},
        },
        error=error,
    )
    return [root, *spans]


def _turn_spans(trace: str, seat_path: str, turn: SampledTurn | ExternalTurn, at: datetime) -> list[Span]:
    path = f"{seat_path}/turn/{turn.turn_index}"
    timings = turn.timings
    render_s, sample_s = _duration(timings.get("render_s")), _duration(timings.get("sample_s"))
    start = at - _seconds(render_s + sample_s)
    attributes: dict[str, AttributeValue | None] = {
        "rollout.turn_index": turn.turn_index,
        "rollout.finish_reason": turn.finish_reason,
    }
    if isinstance(turn, ExternalTurn):
        attributes |= {
            "gen_ai.request.model": turn.model,
            "gen_ai.usage.input_tokens": turn.prompt_tokens,
            "gen_ai.usage.output_tokens": turn.completion_tokens,
        }
    else:
        attributes |= {
            "rollout.checkpoint": turn.checkpoint,
            "rollout.checkpoint_version": turn.checkpoint_version,
            "rollout.engine": turn.engine or None,
            "rollout.segment": turn.segment_id,
            "gen_ai.usage.input_tokens": turn.prompt_prefix_len + len(turn.prompt_ids_delta),
            "gen_ai.usage.output_tokens": len(turn.completion_ids),
            "gen_ai.usage.cache_read.input_tokens": turn.cached_tokens,
        }
    whole = span(trace, path, f"turn {turn.turn_index}", start, at, parent=seat_path, attributes=attributes)
    if isinstance(turn, ExternalTurn):
        return [whole]  # answered by a model the platform does not run: no engine of ours to time
    rendered = start + _seconds(render_s)
    return [
        whole,
        span(trace, f"{path}/gateway", "gateway render", start, rendered, parent=path),
        span(
            trace,
            f"{path}/engine",
            "engine sample",
            rendered,
            at,
            parent=path,
            attributes={
                "rollout.engine": turn.engine or None,
                **{  # the engine's own timings (queued_s, compute_s): a few finite numbers, never more
                    f"rollout.engine.{name}": value
                    for name, value in list(timings.items())[:ENGINE_TIMINGS]
                    if name not in ("render_s", "sample_s") and math.isfinite(value)
                },
            },
        ),
    ]


async def step_spans(ledger: Ledger, run: str, policy: str, step: RecordedStep) -> list[Span]:
    """The trace of one complete step of `policy` (its name in the environment)."""
    trace = step_trace_id(run, policy, step.batch.step)
    checkpoint = step.checkpoint.name if step.checkpoint is not None else None
    spans: list[Span] = []
    end = step.at
    if checkpoint is not None:
        spans.append(span(trace, "train", "train", step.batch_at, step.at, parent="step"))
        for event in await read_all(ledger, policy_bridges_stream(run_policy(run, policy))):
            for bridged in records_of([event], CheckpointConverted):
                if bridged.name != checkpoint:
                    continue
                form = bridged.format
                spans.append(
                    span(trace, f"bridge/{form}", f"bridge {form}", step.at, event.recorded_at, parent="step")
                )
                end = max(end, event.recorded_at)
        targets = await serving_targets_of(ledger, checkpoint)
        if targets:
            asked = min(t.recorded_at for t in targets)
            served = await first_served(ledger, checkpoint)
            for engine, at in sorted(served.items()):
                spans.append(
                    span(
                        trace,
                        f"serving/{engine}",
                        f"serve {engine}",
                        asked,
                        at,
                        parent="serving",
                        attributes={"rollout.engine": engine},
                    )
                )
            done = max([asked, *served.values()])
            spans.append(
                span(
                    trace,
                    "serving",
                    "serving",
                    asked,
                    done,
                    parent="step",
                    attributes={
                        "rollout.formats": ",".join(
                            sorted({t.format for t in records_of(targets, ServingTarget)})
                        )
                    },
                )
            )
            end = max(end, done)
    loss = step.checkpoint.metrics.get("loss") if step.checkpoint is not None else None
    root = span(
        trace,
        "step",
        f"step {step.batch.step}",
        step.batch_at,
        end,
        parent=None,
        attributes={
            "rollout.run": run,
            "rollout.policy": policy,
            "rollout.step": step.batch.step,
            "rollout.trained": checkpoint is not None,
            "rollout.checkpoint": checkpoint,
            "rollout.tokens_trained": step.batch.sampled_tokens,
            "rollout.episodes": len(step.batch.episodes),
            "rollout.loss": loss,
        },
    )
    return [root, *spans]


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def _duration(value: object) -> float:
    """A turn's recorded timing as seconds to draw: any ledger writer can record one, so anything but a
    number from 0 to `MAX_TURN_S` (inf, NaN, 1e308, a string) is drawn as 0, never raised on."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= MAX_TURN_S:
        return 0.0
    return float(value)


class TraceReader:
    """A run's trace entries read poll after poll, from where its backend holds them."""

    def __init__(self, given: TrackingInput) -> None:
        self.given = given
        self.caught_up = False
        self.counts: tuple[object, ...] | None = None
        self.steps: dict[str, list[RecordedStep]] = {}

    async def read(self, ledger: Ledger, held: Mapping[str, int], *, release: bool = False) -> list[Entry]:
        run, policies = self.given.run, self.given.policies
        entries: list[Entry] = []
        events = await ledger.read(
            run_episodes_stream(run), after=max(0, held.get(EPISODES_STREAM, 0)), limit=EVENTS_PER_READ
        )
        for event in events:
            spans: list[Span] = []
            try:
                ended = episode_ended(event)
            except ValueError:
                ended = None
            if ended is not None:
                spans = await episode_spans(ledger, run, ended, event.recorded_at)
            entries.append(
                Entry(EPISODES_STREAM, event.seq, event.recorded_at.isoformat(), spans=tuple(spans))
            )
        self.caught_up = len(events) < EVENTS_PER_READ
        progress = await run_progress(ledger, run)
        counts = tuple(sorted(progress.policies.items()))
        if counts != self.counts:
            self.steps = {p: await recorded_steps(ledger, run, run_policy(run, p)) for p in policies}
            self.counts = counts
        for policy in policies:
            stream = steps_stream(policy, policies)
            steps = self.steps.get(policy, [])
            for index, step in enumerate(steps):
                if step.batch.step <= held.get(stream, -1) or (index == len(steps) - 1 and not release):
                    continue  # held already, or the newest: its engines may still be taking it
                spans = await step_spans(ledger, run, policy, step)
                entries.append(Entry(stream, step.batch.step, step.at.isoformat(), spans=tuple(spans)))
        return entries
