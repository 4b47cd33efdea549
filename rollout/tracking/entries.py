"""What a tracker is given: the run's records from the ledger as entries of named streams, each logged once.

Contract:
- An `Entry` is one point of one stream: `train` (a one-policy run; `train/POLICY` for each trained policy of
  a run with several), `eval/SUITE/ENVIRONMENT` (the suite's score for a checkpoint of this run, at the
  checkpoint's step; in each name, characters other than letters, digits, `-` and `_` become `_`) and
  `samples` (`samples/POLICY`: a table of sample transcripts every `samples_every` steps). `step` is the
  stream's own axis: a tracker holds at most one entry per (stream, step), and a stream's entries are
  logged in increasing step, so a backend that holds step N of a stream holds every entry of it up to N
  (`rollout.tracking.sinks`). The trace streams (`traces/…`, built by rollout.tracking.traces) follow the
  same rule and go to a trace backend only (`is_trace`).
- `run_entries(ledger, given, policies)` reads every entry the ledger holds now (`step_entries`, then
  `eval_entries` of the checkpoints those published), ordered by when the ledger recorded it (`in_order`):
  the same ledger gives the same list, and a later call only adds entries (the newest step is left out until
  it publishes: rollout.tracking.step_metrics). An eval recorded for a checkpoint older than one already
  logged in its stream comes after it in the list; a tracker skips it (its axis does not go back).
- `RunReader(given).read(ledger)` is `run_entries` for a feed that polls: the steps are read again only once
  the run's batch or checkpoint counts moved, and each sample table is built once; each eval stream is held
  back at its first checkpoint due an eval (`due_evals`: every `eval_every`-th trained step) that has no score
  yet, so an eval that finished before an earlier one's is logged after it, in step order.
- Values are finite floats named as the step record names them (`reward_mean`, `loss`, `failures/KIND`, …);
  a field the step did not record is left out, never 0.
- A sample table's replies come from the turns' parsed replies; the prompts are not text in the ledger
  (token ids only), so a table shows each episode's replies, reward, turns and the checkpoint that sampled.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from rollout.ledger import Kind, Ledger
from rollout.ledger.payloads import episode_ended, episode_ended_key, turn_recorded
from rollout.ledger.queries import read_all, run_progress
from rollout.ledger.streams import (
    EVAL_SUITES,
    eval_results_stream,
    run_batches_stream,
    run_episodes_stream,
    seat_stream,
)
from rollout.records.batches import BatchInfo
from rollout.records.evals import EvalResult
from rollout.tracking.spans import Span
from rollout.tracking.step_metrics import StepMetrics, step_metrics
from rollout.workflows.names import run_policy
from rollout.workflows.tracking_types import TrackingInput

TRACE_STREAMS = "traces/"
SAMPLE_COLUMNS = ("step", "episode", "agent", "checkpoint", "reward", "turns", "replies")
REPLY_CHARS = 4000  # of one episode's replies, shown in a table cell


@dataclass(frozen=True)
class SampleTable:
    columns: tuple[str, ...]
    rows: list[list[Any]]


@dataclass(frozen=True)
class Entry:
    stream: str
    step: int
    at: str  # ISO 8601: when the ledger recorded what it shows
    values: dict[str, float] = field(default_factory=dict[str, float])
    table: SampleTable | None = None
    spans: tuple[Span, ...] = ()  # a trace stream's entry (rollout.tracking.traces): its spans


def is_trace(entry: Entry) -> bool:
    """Whether `entry` is of a trace stream (`traces/…`), which only a trace backend takes."""
    return entry.stream.startswith(TRACE_STREAMS)


def stream_part(name: str) -> str:
    """A suite's, environment's or policy's name as one part of a stream's name: W&B reads `.` in a name as
    nesting, so anything but letters, digits, `-` and `_` becomes `_` (`tests.coin` -> `tests_coin`)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def train_stream(policy: str, policies: list[str]) -> str:
    return "train" if len(policies) == 1 else f"train/{stream_part(policy)}"


def samples_stream(policy: str, policies: list[str]) -> str:
    return "samples" if len(policies) == 1 else f"samples/{stream_part(policy)}"


def step_values(record: StepMetrics) -> dict[str, float]:
    """The step record's numbers, flat: its fields, its failures as `failures/KIND` and its extra metrics."""
    values: dict[str, float] = {}
    for name, value in record.to_json().items():
        if isinstance(value, int | float):  # bool is an int: trained -> 1.0
            values[name] = float(value)
    values.update({f"failures/{kind}": float(n) for kind, n in record.failures.items()})
    values.update({name: float(v) for name, v in record.extra.items()})
    return {name: v for name, v in values.items() if math.isfinite(v)}


@dataclass(frozen=True)
class StepEntries:
    """A run's step and sample-table entries, and the step of each checkpoint they published (what its evals
    are logged at)."""

    entries: list[Entry]
    steps_of: dict[str, int]  # checkpoint name -> its step


async def run_entries(ledger: Ledger, given: TrackingInput, policies: list[str]) -> list[Entry]:
    steps = await step_entries(ledger, given, policies)
    return in_order(steps.entries + await eval_entries(ledger, steps.steps_of))


def in_order(entries: list[Entry]) -> list[Entry]:
    """The ledger's order (at one time, a step before its table of samples), each stream's steps increasing:
    where a stream's later step was recorded first (the evals of two checkpoints finish in either order), the
    stream's places in the order take its entries by step."""
    ordered = sorted(entries, key=lambda e: (e.at, e.stream.startswith("samples"), e.stream, e.step))
    by_step: dict[str, list[Entry]] = {}
    for entry in sorted(ordered, key=lambda e: e.step):
        by_step.setdefault(entry.stream, []).append(entry)
    taken: dict[str, int] = {}
    placed = []
    for entry in ordered:
        index = taken.get(entry.stream, 0)
        placed.append(by_step[entry.stream][index])
        taken[entry.stream] = index + 1
    return placed


def due_evals(entries: list[Entry], every: int) -> set[int]:
    """The steps whose checkpoints the run evaluates: every `every`-th trained step of each policy."""
    trained: dict[str, list[int]] = {}
    for entry in entries:
        if entry.stream.startswith("train") and entry.values.get("trained"):
            trained.setdefault(entry.stream, []).append(entry.step)
    return {
        step
        for steps in trained.values()
        for n, step in enumerate(sorted(steps), 1)
        if every and n % every == 0
    }


def evals_pending(entries: list[Entry], every: int) -> bool:
    """Whether a checkpoint the run evaluates has no eval entry yet."""
    evaluated = {e.step for e in entries if e.stream.startswith("eval/")}
    return bool(due_evals(entries, every) - evaluated)


def held_back(entries: list[Entry], every: int) -> list[Entry]:
    """The entries without each eval stream's steps past its first due step that has no score yet: a stream's
    axis does not go back, so a checkpoint's eval that finished before an earlier one's waits for it."""
    due = due_evals(entries, every)
    present: dict[str, set[int]] = {}
    for entry in entries:
        if entry.stream.startswith("eval/"):
            present.setdefault(entry.stream, set()).add(entry.step)
    cut = {stream: min(due - steps, default=None) for stream, steps in present.items()}
    return [e for e in entries if (c := cut.get(e.stream)) is None or e.step < c]


class RunReader:
    """A run's entries read poll after poll (what a feed does): the steps again only once the run's batch or
    checkpoint counts moved (step records read every episode of the run), each sample table once, the evals
    every time."""

    def __init__(self, given: TrackingInput) -> None:
        self.given = given
        self.tables: dict[tuple[str, int], SampleTable] = {}
        self.counts: tuple[object, ...] | None = None
        self.steps = StepEntries([], {})

    async def read(self, ledger: Ledger, *, release: bool = False) -> list[Entry]:
        """The entries, each eval stream `held_back` unless `release` (the run is over: its missing evals
        will not come)."""
        progress = await run_progress(ledger, self.given.run)
        counts = tuple(sorted(progress.policies.items()))
        if counts != self.counts:
            self.steps = await step_entries(ledger, self.given, self.given.policies, self.tables)
            self.counts = counts
        entries = self.steps.entries + await eval_entries(ledger, self.steps.steps_of)
        return in_order(entries if release else held_back(entries, self.given.eval_every))


async def step_entries(
    ledger: Ledger,
    given: TrackingInput,
    policies: list[str],
    tables: dict[tuple[str, int], SampleTable] | None = None,
) -> StepEntries:
    """Every complete step's entry and the sample tables due; `tables` keeps the tables built (by policy and
    step: a step's table never changes) for the next call."""
    tables = {} if tables is None else tables
    entries: list[Entry] = []
    steps_of: dict[str, int] = {}
    for policy in policies:
        for record in await step_metrics(ledger, given.run, policy):
            entries.append(
                Entry(train_stream(policy, policies), record.step, record.recorded_at, step_values(record))
            )
            if record.checkpoint:
                steps_of[record.checkpoint] = record.step
            if given.samples_every and given.samples and record.step % given.samples_every == 0:
                table = tables.get((policy, record.step))
                if table is None:
                    table = await sample_table(ledger, given.run, policy, record.step, given.samples)
                    tables[(policy, record.step)] = table
                entries.append(
                    Entry(samples_stream(policy, policies), record.step, record.recorded_at, table=table)
                )
    return StepEntries(entries, steps_of)


async def eval_entries(ledger: Ledger, steps_of: dict[str, int]) -> list[Entry]:
    """The eval results of the run's checkpoints (`steps_of`), each at its checkpoint's step."""
    if not steps_of:
        return []
    found: list[Entry] = []
    # Suites by the keys they were registered under (`NAME@VERSION`), and each result checked as it is read:
    # one payload the ledger holds that does not parse costs its own entry, never the feed.
    suites = sorted({e.key.rsplit("@", 1)[0] for e in await read_all(ledger, EVAL_SUITES)})
    for name in suites:
        for event in await read_all(ledger, eval_results_stream(name)):
            try:
                result = EvalResult.from_payload(dict(event.payload))
            except (TypeError, ValueError):
                continue
            step = steps_of.get(result.checkpoint)
            if step is None:
                continue
            values = {
                "score": result.score,
                "low": result.low,
                "high": result.high,
                "episodes": float(result.episodes),
                "failed": float(result.failed),
            }
            found.append(
                Entry(
                    f"eval/{stream_part(result.suite)}/{stream_part(result.environment)}",
                    step,
                    event.recorded_at.isoformat(),
                    {k: v for k, v in values.items() if math.isfinite(v)},
                )
            )
    return found


async def sample_table(ledger: Ledger, run: str, policy: str, step: int, n: int) -> SampleTable:
    """Up to `n` of the episodes step `step` of `policy` trained on, one row per agent of the policy."""
    batch_event = await ledger.find(run_batches_stream(run, run_policy(run, policy)), f"step/{step}")
    rows: list[list[Any]] = []
    if batch_event is None:
        return SampleTable(SAMPLE_COLUMNS, rows)
    batch = BatchInfo.from_payload(batch_event.payload)
    for episode in (batch.trained_episodes or batch.episodes)[:n]:
        event = await ledger.find(run_episodes_stream(run), episode_ended_key(episode, finished=True))
        ended = episode_ended(event) if event is not None else None
        if ended is None:
            continue
        for agent, seat in ended.seats.items():
            replies: list[str] = []
            checkpoint = ""
            for turn_event in await read_all(ledger, seat_stream(seat)):
                if turn_event.kind != Kind.TURN_RECORDED:
                    continue
                turn = turn_recorded(turn_event.payload)
                if turn.policy not in ("", policy, run_policy(run, policy)):
                    break  # an agent of another policy
                checkpoint = getattr(turn, "checkpoint", "") or checkpoint
                replies.append(_text(turn.reply))
            reward = ended.rewards.get(agent)
            rows.append(
                [
                    step,
                    episode,
                    agent,
                    checkpoint,
                    reward,
                    ended.turns.get(agent, len(replies)),
                    "\n---\n".join(replies)[:REPLY_CHARS],
                ]
            )
    return SampleTable(SAMPLE_COLUMNS, rows)


def _text(reply: dict[str, Any]) -> str:
    """A reply (a `rollout.contracts.Message` as JSON) as text: what it said, then its tool calls."""
    text = reply.get("text")
    shown = text if isinstance(text, str) else ""
    for call in reply.get("tool_calls") or ():
        if isinstance(call, dict):
            shown += f"\n[tool call {call.get('name', '?')}({str(call.get('arguments', ''))[:200]})]"
    return shown
