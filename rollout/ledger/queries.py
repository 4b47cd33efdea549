"""Named read queries of the ledger's tables (the run views' aggregates are in `rollout.ledger.views`).

Contract:
- Every function reads (nothing here writes), takes a `Ledger` and returns typed values: no caller outside
  this package sends SQL to the ledger. Stream and lease names come from `rollout.ledger.streams`.
- Reads see what is committed when they run; each function is one round trip unless it says otherwise.
- "Live" means a lease whose `expires_at` is ahead by the database's clock (the one leases are granted by).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rollout.ledger.events import Kind, Lease, RecordedEvent
from rollout.ledger.store import Ledger
from rollout.ledger.streams import (
    SERVING_ACKS,
    SERVING_TARGETS,
    policy_checkpoints_stream,
    run_batches_stream,
    run_episodes_stream,
    sandbox_host_leases_prefix,
    sandbox_leases_prefix,
    seat_stream,
)
from rollout.run.settings import BadRunSetting, RunSettings

# ---- runs --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    """A run as the `run` projection holds it: its current settings (max_lag, paused, ...)."""

    run: str
    environment: str
    settings: RunSettings
    created_at: datetime
    updated_seq: int  # the seq, on `run/{run}`, of the last event folded into the row


_RUN_COLUMNS = "run_id, environment, settings, created_at, updated_seq"


def _run(row: dict[str, Any]) -> RunRow:
    return RunRow(
        run=row["run_id"],
        environment=row["environment"],
        settings=RunSettings.from_recorded(row["settings"]),
        created_at=row["created_at"],
        updated_seq=int(row["updated_seq"]),
    )


async def list_runs(ledger: Ledger, *, limit: int | None = None, offset: int = 0) -> list[RunRow]:
    """Every run (or a page of `limit` from `offset`), newest first; a run whose recorded settings do not
    parse (forged) is passed over."""
    rows = await ledger._fetch_all(
        f"SELECT {_RUN_COLUMNS} FROM run ORDER BY created_at DESC, run_id DESC LIMIT %s OFFSET %s",
        (limit, offset),
    )
    found = []
    for row in rows:
        with contextlib.suppress(BadRunSetting):
            found.append(_run(row))
    return found


async def count_runs(ledger: Ledger) -> int:
    row = await ledger._fetch_one("SELECT count(*) AS runs FROM run")
    return int((row or {}).get("runs") or 0)


async def find_run(ledger: Ledger, run: str) -> RunRow | None:
    """The run named `run`, if it was created. Raises `BadRunSetting` when its recorded settings do not parse
    (forged): a caller that admits turns by them refuses."""
    row = await ledger._fetch_one(f"SELECT {_RUN_COLUMNS} FROM run WHERE run_id = %s", (run,))
    return None if row is None else _run(row)


@dataclass(frozen=True)
class PolicyProgress:
    """How far the training of one policy (a ledger policy, `{run}/{name}`) has come."""

    batches_assembled: int = 0  # `BatchAssembled`: one per step that found its whole groups
    batches_skipped: int = 0  # of those, batches without a sampled token (every group had no signal): no step
    groups_replaced: int = 0  # tied groups refill consumed without training, each replaced by a fresh one
    checkpoints: int = 0  # `CheckpointCreated`
    newest_version: int = 0  # the newest checkpoint's version (0: the base model)


@dataclass(frozen=True)
class RunProgress:
    """Where a run is, from the ledger alone."""

    run: str
    episodes_finished: int = 0  # `EpisodeFinished`
    episodes_failed: int = 0  # `EpisodeAbandoned` of a whole episode (an agent failed for good)
    attempts_abandoned: int = 0  # `EpisodeAbandoned` of one agent's attempt (the episode went on)
    groups_recorded: int = 0  # groups with at least one episode recorded for good
    # Given a group size (the ledger does not record it): groups with that many episodes recorded for good
    # (finished or failed: what training consumes), and groups with that many finished. None without one.
    groups_ended: int | None = None
    groups_finished: int | None = None
    policies: dict[str, PolicyProgress] = field(default_factory=dict[str, PolicyProgress])


# Kinds are parameters (the SQL stays a literal string); payload fields are those of rollout.ledger.payloads.
_EPISODE_COUNTS = """
SELECT count(*) FILTER (WHERE kind = %(finished)s) AS finished,
       count(*) FILTER (WHERE kind = %(abandoned)s AND NOT payload ? 'attempt') AS failed,
       count(*) FILTER (WHERE kind = %(abandoned)s AND payload ? 'attempt') AS abandoned,
       count(DISTINCT payload->>'group') FILTER (WHERE NOT payload ? 'attempt') AS groups
  FROM event WHERE stream_id = %(stream)s AND kind IN (%(finished)s, %(abandoned)s)
"""

_WHOLE_GROUPS = """
SELECT count(*) FILTER (WHERE ended >= %(size)s) AS ended,
       count(*) FILTER (WHERE finished >= %(size)s) AS finished
  FROM (SELECT count(DISTINCT payload->>'episode') AS ended,
               count(DISTINCT payload->>'episode') FILTER (WHERE kind = %(finished)s) AS finished
          FROM event
         WHERE stream_id = %(stream)s AND kind IN (%(finished)s, %(abandoned)s) AND NOT payload ? 'attempt'
         GROUP BY payload->>'group') AS groups
"""

# Batch streams are found by prefix in the `stream` table (a row per stream: a scan, fine for a status view).
_BATCH_COUNTS = """
SELECT s.stream_id,
       count(e.seq) AS assembled,
       count(e.seq) FILTER (WHERE (e.payload->>'sampled_tokens')::bigint = 0) AS skipped,
       coalesce(sum((e.payload->>'groups_replaced')::bigint), 0) AS replaced
  FROM stream s LEFT JOIN event e ON e.stream_id = s.stream_id AND e.kind = %(kind)s
 WHERE starts_with(s.stream_id, %(prefix)s)
 GROUP BY s.stream_id
"""

_CHECKPOINT_COUNTS = """
SELECT stream_id, count(*) AS checkpoints, max((payload->>'version')::bigint) AS newest FROM event
 WHERE stream_id = ANY(%(streams)s) AND kind = %(kind)s
 GROUP BY stream_id
"""


async def run_progress(ledger: Ledger, run: str, *, group_size: int | None = None) -> RunProgress:
    """Episodes, groups, and per trained policy batches and checkpoints (three or four round trips).

    The ledger does not record a run's group size (its environment has it): pass `group_size` to count whole
    groups. A batch skipped for having no signal is a `BatchAssembled` with no sampled token; the groups
    refill replaced are its `groups_replaced`.
    """
    kinds = {"finished": Kind.EPISODE_FINISHED.value, "abandoned": Kind.EPISODE_ABANDONED.value}
    stream = run_episodes_stream(run)
    episodes = await ledger._fetch_one(_EPISODE_COUNTS, {"stream": stream, **kinds}) or {}
    whole = None
    if group_size is not None:
        whole = await ledger._fetch_one(_WHOLE_GROUPS, {"stream": stream, "size": group_size, **kinds}) or {}
    prefix = run_batches_stream(run, "")
    found = await ledger._fetch_all(_BATCH_COUNTS, {"prefix": prefix, "kind": Kind.BATCH_ASSEMBLED.value})
    batches = {row["stream_id"][len(prefix) :]: row for row in found}
    checkpoints: dict[str, dict[str, Any]] = {}
    if batches:
        streams = {policy_checkpoints_stream(policy): policy for policy in batches}
        params = {"streams": list(streams), "kind": Kind.CHECKPOINT_CREATED.value}
        for row in await ledger._fetch_all(_CHECKPOINT_COUNTS, params):
            checkpoints[streams[row["stream_id"]]] = row
    policies = {
        policy: PolicyProgress(
            batches_assembled=int(row["assembled"]),
            batches_skipped=int(row["skipped"]),
            groups_replaced=int(row["replaced"]),
            checkpoints=int(checkpoints.get(policy, {}).get("checkpoints", 0)),
            newest_version=int(checkpoints.get(policy, {}).get("newest") or 0),
        )
        for policy, row in sorted(batches.items())
    }
    return RunProgress(
        run=run,
        episodes_finished=int(episodes.get("finished") or 0),
        episodes_failed=int(episodes.get("failed") or 0),
        attempts_abandoned=int(episodes.get("abandoned") or 0),
        groups_recorded=int(episodes.get("groups") or 0),
        groups_ended=None if whole is None else int(whole.get("ended") or 0),
        groups_finished=None if whole is None else int(whole.get("finished") or 0),
        policies=policies,
    )


@dataclass(frozen=True)
class FailureCount:
    """How many of a run's episodes failed one way: a failure kind at one place in the environment's code."""

    kind: str  # rollout.run.failures' kinds ("" for an episode recorded before failures were classified)
    where: str | None  # file:line in the environment's code
    count: int
    reason: str  # the reason of the first episode that failed this way
    episode: str  # that episode

    @property
    def summary(self) -> str:
        return f"{self.reason} ({self.where})" if self.where else self.reason


_FAILURE_COUNTS = """
SELECT coalesce(payload->'failure'->>'kind', '') AS kind, payload->'failure'->>'where' AS where_,
       count(*) AS count,
       (array_agg(coalesce(payload->'failure'->>'reason', payload->>'error', '') ORDER BY seq))[1] AS reason,
       (array_agg(payload->>'episode' ORDER BY seq))[1] AS episode
  FROM event
 WHERE stream_id = %(stream)s AND kind = %(abandoned)s AND NOT payload ? 'attempt'
 GROUP BY 1, 2 ORDER BY count(*) DESC, min(seq) LIMIT %(limit)s
"""


async def failure_counts(ledger: Ledger, run: str, *, limit: int = 10) -> list[FailureCount]:
    """Why run `run`'s episodes failed: one count per (kind, place in the environment's code), most first."""
    params = {"stream": run_episodes_stream(run), "abandoned": Kind.EPISODE_ABANDONED.value, "limit": limit}
    return [
        FailureCount(
            kind=str(row["kind"]),
            where=row["where_"],
            count=int(row["count"]),
            reason=str(row["reason"] or ""),
            episode=str(row["episode"] or ""),
        )
        for row in await ledger._fetch_all(_FAILURE_COUNTS, params)
    ]


async def run_turns(ledger: Ledger, run: str) -> list[RecordedEvent]:
    """Every `TurnRecorded` of a run's seats, in recording order (scans the events: for tests, tools)."""
    rows = await ledger._fetch_all(
        "SELECT stream_id, seq, idempotency_key, kind, payload, recorded_at FROM event"
        " WHERE kind = %s AND payload->>'run' = %s ORDER BY recorded_at, stream_id, seq",
        (Kind.TURN_RECORDED.value, run),
    )
    return [_event(row, row["stream_id"]) for row in rows]


# ---- events ------------------------------------------------------------------------------------------------


async def read_all(ledger: Ledger, stream: str) -> list[RecordedEvent]:
    """Every event of `stream`, in order (a page of `Ledger.read` per round trip)."""
    events: list[RecordedEvent] = []
    while page := await ledger.read(stream, after=events[-1].seq if events else 0):
        events += page
    return events


async def count_events(ledger: Ledger, stream: str, kind: str) -> int:
    """How many events of `kind` `stream` holds."""
    row = await ledger._fetch_one(
        "SELECT count(*) AS n FROM event WHERE stream_id = %s AND kind = %s", (stream, str(kind))
    )
    return int(row["n"]) if row else 0


def _event(row: dict[str, Any], stream: str) -> RecordedEvent:
    return RecordedEvent(
        stream=stream,
        seq=row["seq"],
        key=row["idempotency_key"],
        kind=row["kind"],
        payload=row["payload"],
        recorded_at=row["recorded_at"],
        appended=False,
    )


# ---- checkpoints -------------------------------------------------------------------------------------------


async def written_under(ledger: Ledger, stream: str, key: str, resource: str) -> bool:
    """Whether the event under `key` on `stream` was appended by a holder of the lease on `resource`: the
    stream is fenced by that lease and the event carries one of its epochs (an unfenced append carries 0)."""
    row = await ledger._fetch_one(
        "SELECT e.epoch > 0 AND s.fence_resource = %s AS held FROM event e"
        " JOIN stream s ON s.stream_id = e.stream_id WHERE e.stream_id = %s AND e.idempotency_key = %s",
        (resource, stream, key),
    )
    return bool(row and row["held"])


async def newest_checkpoint_version(ledger: Ledger, policy: str) -> int:
    """The version of `policy`'s newest checkpoint; 0 (the base model) when it has none."""
    row = await ledger._fetch_one(
        "SELECT max((payload->>'version')::bigint) AS newest FROM event WHERE stream_id = %s AND kind = %s",
        (policy_checkpoints_stream(policy), Kind.CHECKPOINT_CREATED.value),
    )
    return int(row["newest"]) if row and row["newest"] is not None else 0


async def served_lineage(ledger: Ledger, policy: str) -> list[str]:
    """The names of `policy`'s checkpoints that engines can serve (they have a `ServingTarget`), oldest
    first: the lineage a self-play pin picks from (rollout.run.pins)."""
    rows = await ledger._fetch_all(
        "SELECT c.payload->>'name' AS name FROM event c WHERE c.stream_id = %s AND c.kind = %s"
        " AND EXISTS (SELECT 1 FROM event t WHERE t.stream_id = %s AND t.kind = %s"
        " AND t.payload->>'checkpoint' = c.payload->>'name')"
        " ORDER BY (c.payload->>'version')::bigint",
        (
            policy_checkpoints_stream(policy),
            Kind.CHECKPOINT_CREATED.value,
            SERVING_TARGETS,
            Kind.SERVING_TARGET.value,
        ),
    )
    return [str(row["name"]) for row in rows]


async def checkpoint_payload(ledger: Ledger, policy: str, name: str) -> dict[str, Any] | None:
    """The `CheckpointCreated` payload of checkpoint `name` on `policy`'s stream, if it is there."""
    row = await ledger._fetch_one(
        "SELECT payload FROM event WHERE stream_id = %s AND kind = %s AND payload->>'name' = %s",
        (policy_checkpoints_stream(policy), Kind.CHECKPOINT_CREATED.value, name),
    )
    return None if row is None else dict(row["payload"])


async def checkpoint_names(ledger: Ledger) -> list[str]:
    """The name of every recorded checkpoint, oldest first (scans `CheckpointCreated` events: for error
    messages and tools)."""
    rows = await ledger._fetch_all(
        "SELECT payload->>'name' AS name FROM event WHERE kind = %s ORDER BY recorded_at",
        (Kind.CHECKPOINT_CREATED.value,),
    )
    return [str(row["name"]) for row in rows]


async def serving_target_formats(ledger: Ledger, checkpoint: str) -> list[str]:
    """The formats checkpoint `checkpoint` has a `ServingTarget` in (none: no engine can load it yet)."""
    rows = await ledger._fetch_all(
        "SELECT payload->>'format' AS format FROM event WHERE stream_id = %s AND kind = %s"
        " AND payload->>'checkpoint' = %s ORDER BY seq",
        (SERVING_TARGETS, Kind.SERVING_TARGET.value, checkpoint),
    )
    return [str(row["format"]) for row in rows]


async def serving_targets_of(ledger: Ledger, checkpoint: str) -> list[RecordedEvent]:
    """The `ServingTarget`s of checkpoint `checkpoint` (one per format), in order."""
    rows = await ledger._fetch_all(
        "SELECT seq, idempotency_key, kind, payload, recorded_at FROM event WHERE stream_id = %s AND kind = %s"
        " AND payload->>'checkpoint' = %s ORDER BY seq",
        (SERVING_TARGETS, Kind.SERVING_TARGET.value, checkpoint),
    )
    return [_event(row, SERVING_TARGETS) for row in rows]


async def first_served(ledger: Ledger, checkpoint: str) -> dict[str, datetime]:
    """When each engine first said it serves checkpoint `checkpoint` (its first `ServingAck` that lists it),
    by engine name."""
    rows = await ledger._fetch_all(
        "SELECT payload->>'engine' AS engine, min(recorded_at) AS at FROM event"
        " WHERE stream_id = %s AND kind = %s AND payload->'serving' @> %s::jsonb GROUP BY 1",
        (SERVING_ACKS, Kind.SERVING_ACK.value, json.dumps([{"checkpoint": checkpoint}])),
    )
    return {str(row["engine"]): row["at"] for row in rows}


# ---- seats -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeatRow:
    """A seat as the `seat` projection holds it."""

    seat: str
    agent: str
    policy: str
    run: str | None
    episode: str | None
    checkpoint: str | None
    open: bool


_SEAT_COLUMNS = "s.seat_id, s.agent, s.policy, s.run_id, s.episode_id, s.checkpoint, s.status"


async def pinned_checkpoint_opened(ledger: Ledger, run: str, episode: str, agent: str) -> str | None:
    """The checkpoint an episode's seat of `agent` was opened pinned to, if it opened pinned (any attempt)."""
    row = await ledger._fetch_one(
        "SELECT checkpoint FROM seat WHERE run_id = %s AND episode_id = %s AND agent = %s"
        " AND checkpoint IS NOT NULL ORDER BY seat_id LIMIT 1",
        (run, episode, agent),
    )
    return None if row is None else str(row["checkpoint"])


def _seat(row: dict[str, Any]) -> SeatRow:
    return SeatRow(
        seat=row["seat_id"],
        agent=row["agent"],
        policy=row["policy"],
        run=row["run_id"],
        episode=row["episode_id"],
        checkpoint=row["checkpoint"],
        open=row["status"] == "open",
    )


async def seat_by_token_hash(ledger: Ledger, token_sha256: str) -> SeatRow | None:
    """The seat whose bearer token has this SHA-256 (hex)."""
    row = await ledger._fetch_one(
        f"SELECT {_SEAT_COLUMNS} FROM seat s WHERE s.token_sha256 = decode(%s, 'hex')", (token_sha256,)
    )
    return None if row is None else _seat(row)


async def seat_and_turn_by_token_hash(
    ledger: Ledger, token_sha256: str, turn_key: str
) -> tuple[SeatRow | None, RecordedEvent | None]:
    """The seat whose token has this SHA-256, and the event recorded under `turn_key` on its stream (None when
    there is none), in one round trip: this is on every turn's path."""
    row = await ledger._fetch_one(
        f"SELECT {_SEAT_COLUMNS}, e.seq, e.idempotency_key, e.kind, e.payload, e.recorded_at FROM seat s"
        " LEFT JOIN event e ON e.stream_id = %s || s.seat_id AND e.idempotency_key = %s"
        " WHERE s.token_sha256 = decode(%s, 'hex')",
        (seat_stream(""), turn_key, token_sha256),
    )
    if row is None:
        return None, None
    seat = _seat(row)
    return seat, None if row["seq"] is None else _event(row, seat_stream(seat.seat))


# ---- leases ------------------------------------------------------------------------------------------------


async def find_lease(ledger: Ledger, resource: str) -> Lease | None:
    """The lease on `resource` as it stands, live or not (rows are never deleted: its epoch is the latest)."""
    row = await ledger._fetch_one(
        "SELECT resource, holder, epoch, expires_at FROM lease WHERE resource = %s", (resource,)
    )
    return None if row is None else Lease(**row)


async def live_lease_holder(ledger: Ledger, resource: str) -> str | None:
    """Who holds the lease on `resource` now; None when nobody does (never granted, released or expired)."""
    row = await ledger._fetch_one(
        "SELECT holder FROM lease WHERE resource = %s AND expires_at > now()", (resource,)
    )
    return None if row is None else str(row["holder"])


async def live_sandbox_hosts(ledger: Ledger, kind: str) -> dict[str, str]:
    """The sandboxes of `kind` whose server holds its host lease now: name -> its holder (`SEATS@ADDRESS`)."""
    prefix = sandbox_host_leases_prefix(kind)
    rows = await ledger._fetch_all(
        "SELECT resource, holder FROM lease WHERE starts_with(resource, %s) AND expires_at > now()", (prefix,)
    )
    return {row["resource"][len(prefix) :]: row["holder"] for row in rows}


async def held_sandbox(ledger: Ledger, kind: str, holder: str) -> str | None:
    """The name of the sandbox of `kind` that `holder` has a live claim on (its newest, if several)."""
    prefix = sandbox_leases_prefix(kind)
    row = await ledger._fetch_one(
        "SELECT resource FROM lease WHERE holder = %s AND expires_at > now() AND starts_with(resource, %s)"
        " ORDER BY epoch DESC LIMIT 1",
        (holder, prefix),
    )
    return None if row is None else str(row["resource"])[len(prefix) :]
