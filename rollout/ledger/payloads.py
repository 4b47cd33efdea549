"""Typed payloads of the events the training loop reads: turns, and episodes as recorded. Pure data, no I/O.

Contract:
- Each record is encoded and checked by the one codec (rollout.records): `to_payload()` is exactly the payload
  its writer appends (a field is never renamed), `from_payload(record.to_payload()) == record`, and
  `from_payload` reads what earlier writers recorded too: a field added later has a default.
- `TurnRecorded` (stream `seat/{seat}`, written by the gateway) is a `SampledTurn` (token ids, one behaviour
  logprob per sampled id) or an `ExternalTurn` (text only, never trained); `turn_recorded` tells them apart.
- On `run/{run}/episodes` (written by the runner), `EpisodeFinished` and the `EpisodeAbandoned` of an
  episode that failed as a whole are an `EpisodeEnded`; the `EpisodeAbandoned` of one agent's attempt (the
  episode goes on with a new attempt) is an `AttemptAbandoned`. `episode_ended` picks out the first.
- The other kinds' records are in rollout.records; rollout.ledger.records maps every kind to its record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.ledger.events import Kind, RecordedEvent
from rollout.records import Payload
from rollout.run.failures import Failure


@dataclass(frozen=True, kw_only=True)
class SampledTurn(Payload):
    """A turn sampled on one of the platform's engines, recorded before its response completed."""

    OMITTED_AT_DEFAULT = ("aborted", "opening", "cached_tokens")

    seat: str = ""
    run: str | None = None
    episode: str | None = None
    agent: str = ""
    policy: str = ""
    turn_index: int
    fingerprint: str = ""
    segment_id: str
    prompt_prefix_len: int  # how many of the segment's earlier ids the prompt keeps
    prompt_ids_delta: tuple[int, ...]  # the prompt's ids after those
    completion_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...]  # one behaviour logprob per sampled id
    checkpoint: str
    checkpoint_version: int = 0
    engine: str = ""
    admitted_newest: int = 0
    admitted_max_lag: int = 0
    finish_reason: str
    stop_sequence: str | None = None
    reply: dict[str, Any]  # the parsed reply: a `rollout.contracts.Message` as JSON
    parse_failures: tuple[str, ...] = ()
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
    cached_tokens: int = 0  # prompt tokens the engine took from its prefix cache instead of computing them

    def __post_init__(self) -> None:
        if not 0 <= self.cached_tokens <= self.prompt_prefix_len + len(self.prompt_ids_delta):
            raise ValueError(f"cached_tokens {self.cached_tokens} is not a count of the prompt's tokens")
        if len(self.completion_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.completion_logprobs)} logprobs: every "
                "sampled token needs its behaviour logprob"
            )


@dataclass(frozen=True, kw_only=True)
class ExternalTurn(Payload):
    """A turn answered by a model the platform does not train (LiteLLM): text only, never trained."""

    OMITTED_AT_DEFAULT = ("aborted",)

    seat: str = ""
    run: str | None = None
    episode: str | None = None
    agent: str = ""
    policy: str = ""
    turn_index: int
    fingerprint: str = ""
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

    def markers(self) -> dict[str, Any]:
        return {"external": True, "trainable": False}


type RecordedTurn = SampledTurn | ExternalTurn


def turn_recorded(payload: Mapping[str, Any]) -> RecordedTurn:
    """A `TurnRecorded` payload as its record."""
    return (
        ExternalTurn.from_payload(payload) if payload.get("external") else SampledTurn.from_payload(payload)
    )


def episode_ended_key(episode: str, *, finished: bool) -> str:
    """The key an episode's `EpisodeFinished` (or whole-episode `EpisodeAbandoned`) is recorded under."""
    return f"{episode}/finished" if finished else f"{episode}/failed"


@dataclass(frozen=True, kw_only=True)
class EpisodeEnded(Payload):
    """An episode recorded for good: `EpisodeFinished` (every agent rewarded), or `EpisodeAbandoned` with the
    error when an agent failed for good (consumed with its group, never trained)."""

    OMITTED_AT_DEFAULT = ("untrained", "failure", "pinned")

    run: str
    episode: str
    group: int
    finished: bool = False
    environment: str = ""
    rewards: dict[str, float] = field(default_factory=dict[str, float])  # by agent
    error: str | None = None
    seats: dict[str, str] = field(default_factory=dict[str, str])  # agent -> the seat it played
    turns: dict[str, int] = field(default_factory=dict[str, int])  # by agent
    metrics: dict[str, dict[str, float]] = field(default_factory=dict[str, dict[str, float]])  # by agent
    sandbox: str | None = None  # the claimed sandbox, kind/name@epoch
    # By agent: the segments (conversations) its environment keeps out of training, such as a client's side
    # tasks.
    untrained: dict[str, list[str]] = field(default_factory=dict[str, list[str]])
    failure: Failure | None = None  # an abandoned episode's first failure, classified (rollout.run.failures)
    # By agent: the checkpoint a self-play pin (rollout.run.pins) played, and the fallback it took, if any.
    pinned: dict[str, str] = field(default_factory=dict[str, str])

    @property
    def kind(self) -> Kind:
        return Kind.EPISODE_FINISHED if self.finished else Kind.EPISODE_ABANDONED

    @property
    def key(self) -> str:
        return episode_ended_key(self.episode, finished=self.finished)

    def markers(self) -> dict[str, Any]:
        if self.finished:
            return {}
        # The failure with its own markers (its class), which a nested record's encoding leaves out.
        failure = {} if self.failure is None else {"failure": self.failure.to_payload()}
        return {"trainable": False, **failure}


@dataclass(frozen=True)
class AttemptAbandoned(Payload):
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

    def markers(self) -> dict[str, Any]:
        return {"trainable": False}


def episode_ended(event: RecordedEvent) -> EpisodeEnded | None:
    """The episode an event of `run/{run}/episodes` records for good (None for an attempt's)."""
    if event.kind == Kind.EPISODE_FINISHED or (
        event.kind == Kind.EPISODE_ABANDONED and "attempt" not in event.payload
    ):
        return EpisodeEnded.from_payload(event.payload)
    return None
