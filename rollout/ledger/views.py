"""The dashboard's reads (`rollout monitor`): runs, steps, episodes, transcripts, the checkpoint tree, evals,
engines and leases, each one or two indexed round trips.

Contract:
- Read-only, like rollout.ledger.queries; typed rows out. Reads of one kind across streams use the
  `event_kind_recorded` index (migration 0004); reads of one stream use its primary key. Every list is bounded
  (`limit`, and `offset` where a person pages), so a view costs the same with 100,000 turns in the ledger.
- Payloads are read as their kinds' records (rollout.ledger.records: the records of rollout.records and
  rollout.ledger.payloads), checked like any input; a field added later may be absent from older events, and
  an event whose payload no writer of ours made (not its record) is left out of a list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rollout.ledger.events import Kind
from rollout.ledger.payloads import EpisodeEnded
from rollout.ledger.store import Ledger
from rollout.ledger.streams import SERVING_ACKS, run_episodes_stream
from rollout.records.checkpoints import CheckpointRecord
from rollout.records.evals import EvalResult
from rollout.records.serving import ServingAck
from rollout.run.failures import Failure


@dataclass(frozen=True)
class StepRow:
    """One checkpoint of a run's policy: its step, metrics and when it was recorded."""

    policy: str
    version: int
    name: str
    parent: str | None
    metrics: dict[str, float]
    recorded_at: datetime
    run: str = ""


async def run_steps(ledger: Ledger, run: str, *, limit: int = 5000) -> list[StepRow]:
    """Every checkpoint a run's training made, oldest first."""
    rows = await ledger._fetch_all(
        "SELECT payload, recorded_at FROM event WHERE kind = %s AND payload->>'run' = %s"
        " ORDER BY recorded_at LIMIT %s",
        (Kind.CHECKPOINT_CREATED.value, run, limit),
    )
    return [step for row in rows if (step := _step(row["payload"], row["recorded_at"])) is not None]


def _step(payload: dict[str, Any], recorded_at: datetime) -> StepRow | None:
    """The step a `CheckpointCreated` payload records; None for one no trainer of ours wrote."""
    try:
        record = CheckpointRecord.from_payload(payload)
    except (TypeError, ValueError):
        return None
    return StepRow(
        record.policy, record.version, record.name, record.parent, record.metrics, recorded_at, record.run
    )


@dataclass(frozen=True)
class EpisodeRate:
    finished: int
    failed: int
    first: datetime | None
    last: datetime | None

    @property
    def per_second(self) -> float:
        if self.first is None or self.last is None or self.finished < 2:
            return 0.0
        span = (self.last - self.first).total_seconds()
        return self.finished / span if span > 0 else 0.0


async def episode_rate(ledger: Ledger, run: str) -> EpisodeRate:
    row = await ledger._fetch_one(
        "SELECT count(*) FILTER (WHERE kind = %(finished)s) AS finished,"
        " count(*) FILTER (WHERE kind = %(abandoned)s AND NOT payload ? 'attempt') AS failed,"
        " min(recorded_at) AS first, max(recorded_at) AS last"
        " FROM event WHERE stream_id = %(stream)s",
        {
            "stream": run_episodes_stream(run),
            "finished": Kind.EPISODE_FINISHED.value,
            "abandoned": Kind.EPISODE_ABANDONED.value,
        },
    )
    row = row or {}
    return EpisodeRate(
        int(row.get("finished") or 0), int(row.get("failed") or 0), row.get("first"), row.get("last")
    )


async def run_activity(ledger: Ledger, runs: list[str]) -> dict[str, tuple[EpisodeRate, int]]:
    """For each of `runs`: its episode rate and how many steps (checkpoints) its training made. Two round
    trips whatever the number of runs (each run's episodes by its stream's key, checkpoints by kind)."""
    streams = {run_episodes_stream(run): run for run in runs}
    episodes = await ledger._fetch_all(
        "SELECT stream_id, count(*) FILTER (WHERE kind = %(finished)s) AS finished,"
        " count(*) FILTER (WHERE kind = %(abandoned)s AND NOT payload ? 'attempt') AS failed,"
        " min(recorded_at) AS first, max(recorded_at) AS last"
        " FROM event WHERE stream_id = ANY(%(streams)s) GROUP BY stream_id",
        {
            "streams": list(streams),
            "finished": Kind.EPISODE_FINISHED.value,
            "abandoned": Kind.EPISODE_ABANDONED.value,
        },
    )
    steps = await ledger._fetch_all(
        "SELECT payload->>'run' AS run, count(*) AS steps FROM event"
        " WHERE kind = %s AND payload->>'run' = ANY(%s) GROUP BY payload->>'run'",
        (Kind.CHECKPOINT_CREATED.value, list(runs)),
    )
    rates = {
        streams[row["stream_id"]]: EpisodeRate(
            int(row["finished"] or 0), int(row["failed"] or 0), row["first"], row["last"]
        )
        for row in episodes
    }
    counts = {str(row["run"]): int(row["steps"]) for row in steps}
    return {run: (rates.get(run, EpisodeRate(0, 0, None, None)), counts.get(run, 0)) for run in runs}


@dataclass(frozen=True)
class EpisodeRow:
    run: str
    episode: str
    group: int
    finished: bool
    rewards: dict[str, float]
    seats: dict[str, str]
    turns: dict[str, int]
    error: str | None
    recorded_at: datetime
    failure: Failure | None = None  # a failed episode's first failure (rollout.run.failures)
    # By agent: the checkpoint a self-play pin played, and the fallback it took (rollout.run.pins).
    pinned: dict[str, str] = field(default_factory=dict[str, str])


async def find_episodes(
    ledger: Ledger,
    *,
    run: str | None = None,
    episode: str | None = None,
    agent: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[EpisodeRow]:
    """Recorded episodes (finished, or failed as a whole), newest first, filtered: by run, by episode id (a
    prefix), by an agent that played it, and by a reward (of that agent, or of any) within [min, max]."""
    rows = await ledger._fetch_all(
        "SELECT kind, payload, recorded_at FROM event"
        " WHERE kind IN (%(finished)s, %(abandoned)s) AND NOT payload ? 'attempt'"
        " AND (%(run)s::text IS NULL OR payload->>'run' = %(run)s)"
        " AND (%(episode)s::text IS NULL OR starts_with(payload->>'episode', %(episode)s))"
        " AND (%(agent)s::text IS NULL OR payload->'seats' ? %(agent)s)"
        " AND (%(lo)s::float8 IS NULL AND %(hi)s::float8 IS NULL OR EXISTS ("
        "   SELECT 1 FROM jsonb_each_text(payload->'rewards') AS r(agent, reward)"
        "    WHERE (%(agent)s::text IS NULL OR r.agent = %(agent)s)"
        "      AND (%(lo)s::float8 IS NULL OR r.reward::float8 >= %(lo)s)"
        "      AND (%(hi)s::float8 IS NULL OR r.reward::float8 <= %(hi)s)))"
        " ORDER BY recorded_at DESC LIMIT %(limit)s OFFSET %(offset)s",
        {
            "finished": Kind.EPISODE_FINISHED.value,
            "abandoned": Kind.EPISODE_ABANDONED.value,
            "run": run,
            "episode": episode,
            "agent": agent,
            "lo": min_reward,
            "hi": max_reward,
            "limit": limit,
            "offset": offset,
        },
    )
    return [found for row in rows if (found := _episode(row)) is not None]


def _episode(row: dict[str, Any]) -> EpisodeRow | None:
    """The episode a row records; None for a payload no runner of ours wrote."""
    try:
        ended = EpisodeEnded.from_payload(row["payload"])
    except ValueError:
        return None
    return EpisodeRow(
        run=ended.run,
        episode=ended.episode,
        group=ended.group,
        finished=row["kind"] == Kind.EPISODE_FINISHED.value,
        rewards=ended.rewards,
        seats=ended.seats,
        turns=ended.turns,
        error=ended.error,
        recorded_at=row["recorded_at"],
        failure=ended.failure,
        pinned=ended.pinned,
    )


@dataclass(frozen=True)
class CheckpointNode:
    """A checkpoint in the tree: its lineage and what became of it."""

    name: str
    policy: str
    version: int
    parent: str | None
    run: str
    metrics: dict[str, float]
    recorded_at: datetime
    formats: list[str] = field(default_factory=list[str])  # the serving formats it was bridged to


async def checkpoint_tree(
    ledger: Ledger, *, run: str | None = None, limit: int = 5000
) -> list[CheckpointNode]:
    """Every checkpoint (of one run, or all; warm starts included), oldest first, with its bridges (two round
    trips)."""
    rows = await ledger._fetch_all(
        "SELECT payload, recorded_at FROM event WHERE kind = %s AND (%s::text IS NULL OR payload->>'run' = %s)"
        " ORDER BY recorded_at LIMIT %s",
        (Kind.CHECKPOINT_CREATED.value, run, run, limit),
    )
    bridged = await ledger._fetch_all(
        "SELECT payload->>'name' AS name, payload->>'format' AS format FROM event WHERE kind = %s",
        (Kind.CHECKPOINT_CONVERTED.value,),
    )
    formats: dict[str, list[str]] = {}
    for row in bridged:
        formats.setdefault(str(row["name"]), []).append(str(row["format"]))
    nodes = []
    for row in rows:
        step = _step(row["payload"], row["recorded_at"])
        if step is None:
            continue
        nodes.append(
            CheckpointNode(
                name=step.name,
                policy=step.policy,
                version=step.version,
                parent=step.parent,
                run=step.run,
                metrics=step.metrics,
                recorded_at=step.recorded_at,
                formats=sorted(formats.get(step.name, [])),
            )
        )
    return nodes


@dataclass(frozen=True)
class EngineRow:
    """An engine's newest ack: what it serves, whether it sleeps, its last failed load, the opponents it holds
    beyond each policy's newest checkpoints and how many it keeps once released."""

    engine: str
    url: str
    serving: list[str]
    sleeping: bool
    failed: dict[str, str] | None
    recorded_at: datetime
    opponents: list[str] = field(default_factory=list[str])
    opponent_budget: int = 0


async def engines(ledger: Ledger) -> list[EngineRow]:
    """Each engine's newest `ServingAck` (by URL). Any ledger writer may append to the acks stream: a payload
    that is not an ack is passed over, never the reason the others go unread."""
    rows = await ledger._fetch_all(
        "SELECT DISTINCT ON (payload->>'url') payload, recorded_at FROM event WHERE stream_id = %s"
        " AND jsonb_typeof(payload->'url') = 'string' ORDER BY payload->>'url', seq DESC",
        (SERVING_ACKS,),
    )
    return [engine for row in rows if (engine := _engine_row(row)) is not None]


def _engine_row(row: dict[str, Any]) -> EngineRow | None:
    try:
        ack = ServingAck.from_payload(row["payload"])
    except (TypeError, ValueError):
        return None
    return EngineRow(
        engine=ack.engine,
        url=ack.url,
        serving=[served.checkpoint for served in ack.serving],
        sleeping=ack.sleeping,
        failed=ack.failed,
        recorded_at=row["recorded_at"],
        opponents=list(ack.opponents),
        opponent_budget=ack.opponent_budget,
    )


async def eval_results(ledger: Ledger, *, limit: int = 20000) -> list[EvalResult]:
    """Every `EvalResult` across suites, oldest first; a payload that is not one is passed over."""
    rows = await ledger._fetch_all(
        "SELECT payload FROM event WHERE kind = %s ORDER BY recorded_at LIMIT %s",
        (Kind.EVAL_RESULT.value, limit),
    )
    found = []
    for row in rows:
        try:
            found.append(EvalResult.from_payload(row["payload"]))
        except (TypeError, ValueError):
            continue
    return found


@dataclass(frozen=True)
class LeaseRow:
    resource: str
    holder: str
    epoch: int
    expires_at: datetime
    live: bool


async def leases(ledger: Ledger, *, limit: int = 1000) -> list[LeaseRow]:
    """Every lease (trainer, GPU, sandbox claims and hosts), live ones first."""
    rows = await ledger._fetch_all(
        "SELECT resource, holder, epoch, expires_at, expires_at > now() AS live FROM lease"
        " ORDER BY expires_at > now() DESC, resource LIMIT %s",
        (limit,),
    )
    return [
        LeaseRow(str(r["resource"]), str(r["holder"]), int(r["epoch"]), r["expires_at"], bool(r["live"]))
        for r in rows
    ]
