"""Typed payloads of the events the training loop reads: turns, and episodes as recorded. Pure data, no I/O.

Contract:
- Each record's `to_payload()` is exactly the payload its writer appends (recorded data and its hashes depend
  on the shape: a field is never renamed), and `from_payload(record.to_payload()) == record`.
- `from_payload` reads what earlier writers recorded too: a field added later has a default.
- `TurnRecorded` (stream `seat/{seat}`, written by the gateway) is a `SampledTurn` (token ids, one behaviour
  logprob per sampled id) or an `ExternalTurn` (text only, never trained); `turn_recorded` tells them apart.
- On `run/{run}/episodes` (written by the runner), `EpisodeFinished` and the `EpisodeAbandoned` of an
  episode that failed as a whole are an `EpisodeEnded`; the `EpisodeAbandoned` of one agent's attempt (the
  episode goes on with a new attempt) is an `AttemptAbandoned`. `episode_ended` picks out the first.
- `CheckpointCreated` is `rollout.training.checkpoints.CheckpointRecord`; `BatchAssembled` is
  `rollout.workflows.types.BatchInfo`: each lives with its writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.ledger.events import Kind, RecordedEvent


@dataclass(frozen=True)
class SampledTurn:
    """A turn sampled on one of the platform's engines, recorded before its response completed."""

    seat: str
    run: str | None
    episode: str | None
    agent: str
    policy: str
    turn_index: int
    fingerprint: str
    segment_id: str
    prompt_prefix_len: int  # how many of the segment's earlier ids the prompt keeps
    prompt_ids_delta: tuple[int, ...]  # the prompt's ids after those
    completion_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...]  # one behaviour logprob per sampled id
    checkpoint: str
    checkpoint_version: int
    engine: str
    admitted_newest: int
    admitted_max_lag: int
    finish_reason: str
    stop_sequence: str | None
    reply: dict[str, Any]  # the parsed reply: a `rollout.contracts.Message` as JSON
    parse_failures: tuple[str, ...]
    n_messages: int
    messages_sha: str
    tools_sha: str
    timings: dict[str, float] = field(default_factory=dict[str, float])
    aborted: str | None = (
        None  # why the client went away mid-stream: such a turn is never replayed or trained
    )
    # A new segment's first turn: the conversation's opening (model asked for, tools, start of its system
    # prompt and first user message; rollout.gateway.segments.conversation_opening). None on later turns.
    opening: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if len(self.completion_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.completion_logprobs)} logprobs: every "
                "sampled token needs its behaviour logprob"
            )

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "seat": self.seat,
            "run": self.run,
            "episode": self.episode,
            "agent": self.agent,
            "policy": self.policy,
            "turn_index": self.turn_index,
            "fingerprint": self.fingerprint,
            "segment_id": self.segment_id,
            "prompt_prefix_len": self.prompt_prefix_len,
            "prompt_ids_delta": list(self.prompt_ids_delta),
            "completion_ids": list(self.completion_ids),
            "completion_logprobs": list(self.completion_logprobs),
            "checkpoint": self.checkpoint,
            "checkpoint_version": self.checkpoint_version,
            "engine": self.engine,
            "admitted_newest": self.admitted_newest,
            "admitted_max_lag": self.admitted_max_lag,
            "finish_reason": self.finish_reason,
            "stop_sequence": self.stop_sequence,
            "reply": self.reply,
            "parse_failures": list(self.parse_failures),
            "n_messages": self.n_messages,
            "messages_sha": self.messages_sha,
            "tools_sha": self.tools_sha,
            "timings": self.timings,
        }
        if self.opening is not None:
            payload["opening"] = self.opening
        return payload if self.aborted is None else {**payload, "aborted": self.aborted}

    @staticmethod
    def from_payload(payload: Mapping[str, Any]) -> SampledTurn:
        return SampledTurn(
            seat=str(payload.get("seat", "")),
            run=payload.get("run"),
            episode=payload.get("episode"),
            agent=str(payload.get("agent", "")),
            policy=str(payload.get("policy", "")),
            turn_index=int(payload["turn_index"]),
            fingerprint=str(payload.get("fingerprint", "")),
            segment_id=str(payload["segment_id"]),
            prompt_prefix_len=int(payload["prompt_prefix_len"]),
            prompt_ids_delta=tuple(int(i) for i in payload["prompt_ids_delta"]),
            completion_ids=tuple(int(i) for i in payload["completion_ids"]),
            completion_logprobs=tuple(float(x) for x in payload["completion_logprobs"]),
            checkpoint=str(payload["checkpoint"]),
            checkpoint_version=int(payload.get("checkpoint_version") or 0),
            engine=str(payload.get("engine", "")),
            admitted_newest=int(payload.get("admitted_newest") or 0),
            admitted_max_lag=int(payload.get("admitted_max_lag") or 0),
            finish_reason=str(payload["finish_reason"]),
            stop_sequence=payload.get("stop_sequence"),
            reply=dict(payload["reply"]),
            parse_failures=tuple(str(f) for f in payload.get("parse_failures", ())),
            n_messages=int(payload["n_messages"]),
            messages_sha=str(payload["messages_sha"]),
            tools_sha=str(payload["tools_sha"]),
            timings=dict(payload.get("timings") or {}),
            aborted=payload.get("aborted"),
            opening=payload.get("opening"),
        )


@dataclass(frozen=True)
class ExternalTurn:
    """A turn answered by a model the platform does not train (LiteLLM): text only, never trained."""

    seat: str
    run: str | None
    episode: str | None
    agent: str
    policy: str
    turn_index: int
    fingerprint: str
    model: str
    finish_reason: str
    reply: dict[str, Any]  # a `rollout.contracts.Message` as JSON
    prompt_tokens: int
    completion_tokens: int
    n_messages: int
    messages_sha: str
    tools_sha: str
    timings: dict[str, float] = field(default_factory=dict[str, float])
    aborted: str | None = None

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "seat": self.seat,
            "run": self.run,
            "episode": self.episode,
            "agent": self.agent,
            "policy": self.policy,
            "turn_index": self.turn_index,
            "fingerprint": self.fingerprint,
            "external": True,
            "trainable": False,
            "model": self.model,
            "finish_reason": self.finish_reason,
            "reply": self.reply,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "n_messages": self.n_messages,
            "messages_sha": self.messages_sha,
            "tools_sha": self.tools_sha,
            "timings": self.timings,
        }
        return payload if self.aborted is None else {**payload, "aborted": self.aborted}

    @staticmethod
    def from_payload(payload: Mapping[str, Any]) -> ExternalTurn:
        return ExternalTurn(
            seat=str(payload.get("seat", "")),
            run=payload.get("run"),
            episode=payload.get("episode"),
            agent=str(payload.get("agent", "")),
            policy=str(payload.get("policy", "")),
            turn_index=int(payload["turn_index"]),
            fingerprint=str(payload.get("fingerprint", "")),
            model=str(payload["model"]),
            finish_reason=str(payload["finish_reason"]),
            reply=dict(payload["reply"]),
            prompt_tokens=int(payload["prompt_tokens"]),
            completion_tokens=int(payload["completion_tokens"]),
            n_messages=int(payload["n_messages"]),
            messages_sha=str(payload["messages_sha"]),
            tools_sha=str(payload["tools_sha"]),
            timings=dict(payload.get("timings") or {}),
            aborted=payload.get("aborted"),
        )


type RecordedTurn = SampledTurn | ExternalTurn


def turn_recorded(payload: Mapping[str, Any]) -> RecordedTurn:
    """A `TurnRecorded` payload as its record."""
    return (
        ExternalTurn.from_payload(payload) if payload.get("external") else SampledTurn.from_payload(payload)
    )


def episode_ended_key(episode: str, *, finished: bool) -> str:
    """The key an episode's `EpisodeFinished` (or whole-episode `EpisodeAbandoned`) is recorded under."""
    return f"{episode}/finished" if finished else f"{episode}/failed"


@dataclass(frozen=True)
class EpisodeEnded:
    """An episode recorded for good: `EpisodeFinished` (every agent rewarded), or `EpisodeAbandoned` with the
    error when an agent failed for good (consumed with its group, never trained)."""

    run: str
    episode: str
    group: int
    finished: bool
    environment: str
    rewards: dict[str, float] = field(default_factory=dict[str, float])  # by agent
    error: str | None = None
    seats: dict[str, str] = field(default_factory=dict[str, str])  # agent -> the seat it played
    turns: dict[str, int] = field(default_factory=dict[str, int])  # by agent
    metrics: dict[str, dict[str, float]] = field(default_factory=dict[str, dict[str, float]])  # by agent
    sandbox: str | None = None  # the claimed sandbox, kind/name@epoch
    # By agent: the segments (conversations) its environment keeps out of training, such as a client's side tasks.
    untrained: dict[str, list[str]] = field(default_factory=dict[str, list[str]])

    @property
    def kind(self) -> Kind:
        return Kind.EPISODE_FINISHED if self.finished else Kind.EPISODE_ABANDONED

    @property
    def key(self) -> str:
        return episode_ended_key(self.episode, finished=self.finished)

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "run": self.run,
            "episode": self.episode,
            "group": self.group,
            "finished": self.finished,
            "rewards": self.rewards,
            "error": self.error,
            "environment": self.environment,
            "seats": self.seats,
            "turns": self.turns,
            "metrics": self.metrics,
            "sandbox": self.sandbox,
        }
        if self.untrained:
            payload["untrained"] = self.untrained
        return payload if self.finished else {**payload, "trainable": False}

    @staticmethod
    def from_payload(payload: Mapping[str, Any]) -> EpisodeEnded:
        return EpisodeEnded(
            run=str(payload["run"]),
            episode=str(payload["episode"]),
            group=int(payload["group"]),
            finished=bool(payload.get("finished")),
            environment=str(payload.get("environment", "")),
            rewards={agent: float(r) for agent, r in (payload.get("rewards") or {}).items()},
            error=payload.get("error"),
            seats=dict(payload.get("seats") or {}),
            turns={agent: int(n) for agent, n in (payload.get("turns") or {}).items()},
            metrics={agent: dict(m) for agent, m in (payload.get("metrics") or {}).items()},
            sandbox=payload.get("sandbox"),
            untrained={
                agent: [str(s) for s in ids] for agent, ids in (payload.get("untrained") or {}).items()
            },
        )


@dataclass(frozen=True)
class AttemptAbandoned:
    """One agent's attempt given up (`EpisodeAbandoned` with `attempt`): its seat is never trained, and the
    episode goes on with a fresh attempt."""

    run: str
    episode: str
    agent: str
    seat: str
    attempt: int
    reason: str

    @property
    def key(self) -> str:
        return f"{self.episode}/{self.agent}/attempt/{self.attempt}/abandoned"

    def to_payload(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "episode": self.episode,
            "agent": self.agent,
            "seat": self.seat,
            "attempt": self.attempt,
            "reason": self.reason,
            "trainable": False,
        }

    @staticmethod
    def from_payload(payload: Mapping[str, Any]) -> AttemptAbandoned:
        return AttemptAbandoned(
            run=str(payload["run"]),
            episode=str(payload["episode"]),
            agent=str(payload["agent"]),
            seat=str(payload["seat"]),
            attempt=int(payload["attempt"]),
            reason=str(payload["reason"]),
        )


def episode_ended(event: RecordedEvent) -> EpisodeEnded | None:
    """The episode an event of `run/{run}/episodes` records for good (None for an attempt's)."""
    if event.kind == Kind.EPISODE_FINISHED or (
        event.kind == Kind.EPISODE_ABANDONED and "attempt" not in event.payload
    ):
        return EpisodeEnded.from_payload(event.payload)
    return None
