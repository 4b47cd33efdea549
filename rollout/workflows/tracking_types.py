"""What crosses the Temporal boundary for a run's tracking (rollout.workflows.tracking): the feed's input and
the state it reports in its heartbeat. No secret is ever one of these fields."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WandbSpec:
    project: str
    entity: str | None = None
    offline: bool = False
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list[str])


@dataclass(frozen=True)
class MlflowSpec:
    tracking_uri: str | None = None  # None: a local sqlite store under the runner's data directory
    experiment: str = "rollout"
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict[str, str])


@dataclass(frozen=True)
class OtlpSpec:
    endpoint: str  # an OTLP/HTTP collector's base URL (`http://HOST:4318`) or its `…/v1/traces` URL


@dataclass(frozen=True)
class TrackingInput:
    run: str
    policies: list[str]  # the trained policies, by their names in the environment
    wandb: WandbSpec | None = None
    mlflow: MlflowSpec | None = None
    otlp: OtlpSpec | None = None  # the run's traces (rollout.tracking.traces) go here
    samples_every: int = 10  # steps between tables of sample transcripts (0: none)
    samples: int = 4  # episodes per table
    config: dict[str, str] = field(default_factory=dict[str, str])  # the run's settings, `key` -> value
    eval_every: int = 0  # the run evaluates every this many checkpoints: the feed waits for the last ones


@dataclass(frozen=True)
class BackendState:
    """One backend as the feed last saw it."""

    backend: str  # wandb | mlflow | otlp
    setting: str  # the setting that points at it, for a person to fix (`tracking.mlflow.tracking_uri`)
    ok: bool
    logged: int  # records logged by this feed so far
    error: str | None = None  # the last refusal, one line
    retry_in_s: float | None = None  # when failing: how long until the next try
    tried: bool = False  # whether the feed has tried it yet (opened it and logged, or been refused)


@dataclass(frozen=True)
class TrackingState:
    run: str
    backends: list[BackendState] = field(default_factory=list[BackendState])
