"""The settings' schema: every key, its type and its default, as typed dataclasses (`Settings` at the top;
each `policies.NAME` a rollout.config.policies.PolicySettings). The single place a key and its type are
declared; YAML (rollout/conf) only sets values. The ledger's roles and logins the settings name are here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from omegaconf import MISSING

from rollout.config import defaults
from rollout.config.policies import (
    PolicySettings,
)
from rollout.security.isolation import SandboxIsolation
from rollout.security.keyfiles import known_ledger_password


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


LEDGER_WORKER_ROLE = "rollout_worker"
"""The database role that writes anything through the ledger's functions (no UPDATE, DELETE or TRUNCATE on any
table; migration 0003): the services' login on a server of your own that has no login per writer kind."""
LEDGER_READER_ROLE = "rollout_reader"  # SELECT only: the dashboard's
LEDGER_SANDBOX_ROLE = "rollout_sandbox"  # sandbox hosts': only their pool streams and host leases


class LedgerWriter(StrEnum):
    """The kinds of service that write the ledger, each with a login of its own (`role`) that appends only its
    own event kinds and holds only its own leases (migration 0010). The runner's login holds the evals' rights
    too: the runner worker hosts evals' activities."""

    gateway = "gateway"
    runner = "runner"
    trainer = "trainer"
    serving = "serving"  # the engines' acks

    @property
    def role(self) -> str:
        return f"rollout_{self.value}"


SERVICE_LEDGER_ROLES = (
    LEDGER_WORKER_ROLE,
    LEDGER_READER_ROLE,
    LEDGER_SANDBOX_ROLE,
    *(writer.role for writer in LedgerWriter),
)
"""Every login the ledger's migrations make for services (the embedded server gives each its password)."""


@dataclass
class PostgresSettings:
    url: str | None = None
    worker_url: str | None = None  # the services' URL; default: the worker role on the embedded server
    reader_url: str | None = None  # the dashboard's; default: the reader role on the embedded server
    sandbox_url: str | None = None  # sandbox hosts'; default: the sandbox role on the embedded server
    # Each writer kind's (LedgerWriter); default: its role on the embedded server, else worker_url (or url).
    gateway_url: str | None = None
    runner_url: str | None = None
    trainer_url: str | None = None
    serving_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 54329
    database: str = "rollout"


@dataclass
class TemporalSettings:
    address: str | None = None
    ui_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 7233
    ui_port: int = 8233
    namespace: str = "default"
    # TLS to a Temporal cluster of your own (rollout.security.temporal_tls); the embedded dev server speaks
    # none. PEM files: the CA that signed the server's certificate, and the client's certificate and key
    # (mutual TLS).
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None  # the name on the server's certificate, when not the address's host


@dataclass
class GatewaySettings:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "smollm2"
    engine_host: str = "127.0.0.1"  # the local engine: only the gateway talks to it, and it asks no key
    engine_port: int = 8100
    max_context: int = 8192
    # How long an agent's turn keeps retrying while the gateway or its engine is unreachable (a restart, an
    # outage) before the attempt fails; a replayable episode then rides out the outage instead of being
    # abandoned.
    outage_window_s: float = 600.0
    max_request_bytes: int = 4 * 1024 * 1024  # a larger request body is refused (413) before it is parsed
    # OpenAI-compatible servers a run's external models may name (`MODEL@API_BASE`): a run naming any other
    # is refused, so a ledger writer cannot send prompts (or the provider key LiteLLM adds) elsewhere.
    external_api_bases: list[str] = field(default_factory=list[str])
    # The token budget of a turn whose request names none (OpenAI's max_tokens is optional) on a run that sets
    # no run.max_tokens: without it such a turn could sample to the end of the context. A request's own budget
    # is kept, above this too (the context still bounds it).
    default_max_tokens: int = 4096
    # Turns one seat may have sampled at once; one more gets 429 with Retry-After (the SDKs retry it), so an
    # agent cannot queue enough turns to starve the other seats. A replay of a recorded turn is not counted.
    max_turns_in_flight_per_seat: int = 8


@dataclass
class BlobSettings:
    url: str | None = None
    s3_endpoint: str | None = None
    s3_secure: bool = True


@dataclass
class MonitorSettings:
    """The dashboard (`rollout monitor`): `rollout up` starts it when enabled, on loopback by default."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8501


class EngineKind(StrEnum):
    auto = "auto"  # tinker when trainer.provider=tinker, else local
    local = "local"  # transformers + peft, CPU or GPU
    vllm = "vllm"  # `vllm serve` on a GPU (the `vllm` extra)
    tinker = "tinker"  # Tinker's hosted sampler (TINKER_API_KEY)


@dataclass
class EngineSettings:
    """The engine `rollout up` starts for the gateway, at services.gateway.engine_host:engine_port, serving
    services.gateway.model; the vllm_* keys shape its `vllm serve` command line."""

    kind: EngineKind = EngineKind.auto
    device: str | None = None  # local: cpu or cuda (default cuda when there is one)
    # Self-play opponents (and evals' checkpoints) an engine keeps loaded beyond each policy's newest, once
    # released: the least recently requested is evicted first (a still-requested one is always held).
    opponent_adapters: int = 4
    # local: MiB of key/value states kept across requests, so a conversation's next turn prefills only its new
    # tokens (least recently used evicted first; 0: none). vLLM sizes its own prefix cache inside its budget.
    prefix_cache_mb: int = defaults.PREFIX_CACHE_MB
    # Engines serving the stack's model on this machine, each on its own port (engine_port, then the next
    # ones), each with its follower: the gateway spreads conversations over them (routing.*).
    replicas: int = 1
    vllm_gpu_memory_utilization: float = 0.85  # the share of the GPU vLLM takes (weights + KV cache)
    vllm_quantization: str | None = None  # e.g. bitsandbytes, awq_marlin, gptq_marlin (None: vLLM decides)
    vllm_max_model_len: int | None = None  # None: services.gateway.max_context
    vllm_max_lora_rank: int = 64  # one of rollout.config.checks.VLLM_LORA_RANKS
    vllm_max_loras: int = 4  # adapters resident at once (the follower keeps the newest 2 per policy)
    # Sequences vLLM schedules at once (None: vLLM's own default,
    # rollout.config.budget.vllm_default_max_num_seqs); its start-up profiling samples that many at once, so
    # it also sets the sampler's memory peak the budget counts.
    vllm_max_num_seqs: int | None = None
    vllm_extra_args: list[str] = field(default_factory=list[str])  # appended to `vllm serve`


class RoutingMode(StrEnum):
    affine = "affine"  # a conversation's next turn to the engine and checkpoint of its last, load allowing
    rotate = "rotate"  # the freshest checkpoint first, rotating among the engines serving it


@dataclass
class RoutingSettings:
    """How the gateway picks the engine for a turn (rollout.gateway.affinity, docs/serving.md#routing)."""

    mode: RoutingMode = RoutingMode.affine
    # A conversation keeps its checkpoint across turns while max_lag allows (its segment then has one
    # behaviour policy more often, and its cached prefix stays valid); off: each turn the freshest.
    sticky: bool = True
    # Turns in flight an engine may have beyond the least-loaded eligible one and still take a conversation's
    # next turn: a few more rows cost a decode step little, a move costs a prefill of the whole conversation.
    affinity_slack: int = 4


class GpuMode(StrEnum):
    exclusive = "exclusive"  # engines and the trainer each have their own device
    shared = "shared"  # one device: engines sleep while the trainer steps, passed by a ledger lease


@dataclass
class GpuSettings:
    """`gpu.mode=shared`: the engine and the trainer take turns on one GPU (lease `gpu/{name}` in the
    ledger)."""

    mode: GpuMode = GpuMode.exclusive
    name: str = "0"
    memory_gib: float | None = None  # the device's memory, for `rollout config budget` (a preset names it)
    sequences: int = 8  # sequences the engine holds at once, for the budget's KV cache
    sampled_tokens: int | None = (
        None  # most sampled tokens in one sequence (turns × run.max_tokens); None: all
    )


@dataclass
class SandboxSettings:
    """How the commands agents choose (a shell tool's, a command seat's) are confined: docs/sandboxes.md."""

    isolation: SandboxIsolation = SandboxIsolation.bwrap
    # Where command seats (Claude Code, Codex, scripts) run: "" in the runner's own jail; a pool of the
    # `command` kind (`command`, `command#SUFFIX`) on hosts of their own (`rollout sandbox serve`).
    command_pool: str = ""
    # Folders a command host lets a seat's `program` and `readable` paths be in, besides the system's, /opt
    # and its own Python's (rollout.sandbox.command_host); never the data directory.
    command_readable: list[str] = field(default_factory=list)


@dataclass
class ServiceSettings:
    postgres: PostgresSettings = field(default_factory=PostgresSettings)
    temporal: TemporalSettings = field(default_factory=TemporalSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    blobs: BlobSettings = field(default_factory=BlobSettings)
    monitor: MonitorSettings = field(default_factory=MonitorSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)


class TrainerProvider(StrEnum):
    local = "local"  # torch + peft in the trainer worker
    tinker = "tinker"  # Tinker's hosted trainer (TINKER_API_KEY)


@dataclass
class TrainerSettings:
    """What `rollout train` and `rollout worker trainer` train, and how (`provider`: local, or tinker)."""

    model: str = "smollm2"  # the base model; the engines serve the same one (services.gateway.model)
    steps: int = 100
    groups_per_batch: int = 2
    # Refill (DAPO's dynamic sampling): a group whose rewards all tie (no signal) is replaced by a fresh
    # group, so each step trains groups_per_batch groups that carry signal; at most `refill_max` replaced per
    # step (None: twice groups_per_batch). A step that still finds only ties is skipped for no signal, as
    # without refill.
    refill: bool = True
    refill_max: int | None = None
    seed: int = 0  # the local trainer's torch seed: the adapter's initial weights
    lora_rank: int = 8  # 0: train the full weights
    lora_alpha: int = 16
    learning_rate: float = 1e-5
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 4096
    updates_per_batch: int = 1  # optimiser steps over each batch (PPO's epochs; the local trainer)
    # The policy loss: a built-in one by name (rollout.rl.losses.registry.BUILT_IN: ppo, the default, …), or
    # your own as package.module:attribute; `loss_params` its keyword arguments (ppo: is_cap, clip_low,
    # clip_high; each loss's own in docs/rl-math.md), checked when the settings load.
    loss: str = "ppo"
    loss_params: dict[str, float] = field(default_factory=dict[str, float])
    # IcePop, with any loss: sampled tokens whose ratio π_θ/μ leaves [lo, hi] are dropped, not clipped.
    token_mask_bounds: list[float] | None = None
    # How a group's rewards become advantages: group_norm (GRPO), leave_one_out (RLOO), or your own function
    # as package.module:attribute (rollout.rl.advantages).
    advantage: str = "group_norm"
    device: str | None = None  # cpu or cuda; default cuda when there is one
    gpu_lease: str | None = None  # one-GPU mode: hold this GPU's lease while a step trains
    lease_ttl_s: float = 60.0  # a dead trainer's policy is free for another after this long
    provider: TrainerProvider = TrainerProvider.local
    tinker_base_model: str | None = (
        None  # Tinker's name of the base model (provider tinker), e.g. Qwen/Qwen3-8B
    )
    tinker_url: str | None = None  # None: Tinker's hosted API; the key comes from TINKER_API_KEY
    warm_start: str | None = None  # a checkpoint the first step trains from (`rollout sft` makes one)
    quantization: str | None = None  # nf4: QLoRA, the base in 4 bits (bitsandbytes, CUDA only)
    data_parallel_workers: int = (
        1  # more: each step trains data-parallel on this many Ray workers (the ray extra)
    )
    ray_address: str | None = None  # their Ray cluster (None: RAY_ADDRESS, else a local one)


@dataclass
class RunDefaults:
    """How `rollout train` runs episodes: the run's settings (max_lag and max_tokens change mid-run)."""

    groups_in_flight: int = defaults.GROUPS_IN_FLIGHT
    max_lag: int = defaults.MAX_LAG  # change mid-run: `rollout run set RUN max_lag=3`
    max_tokens: int = defaults.MAX_TOKENS  # sampled tokens per turn, at most
    # The run pauses itself, saying why, when more than this share of its last `failure_window` episodes
    # failed (a broken environment burns no machine); 1 never pauses.
    max_failure_rate: float = defaults.MAX_FAILURE_RATE
    failure_window: int = defaults.FAILURE_WINDOW


class GateAction(StrEnum):
    # Member names equal their values: OmegaConf matches a YAML string against enum names.
    pause = "pause"  # the run pauses, the reason recorded
    rollback = "rollback"  # training goes on from the best checkpoint: a branch in the checkpoint tree
    warn = "warn"  # the decision is recorded and logged; nothing else changes


@dataclass
class EvalGateSettings:
    """What an eval during training does when a checkpoint scores worse than the best before it
    (docs/evals.md)."""

    max_drop: float | None = (
        None  # None: no gate; else a drop in any environment's score beyond this trips it
    )
    action: GateAction = GateAction.warn


@dataclass
class EvalSettings:
    """Evals during `rollout train`: score every `every`-th checkpoint on `suite` (NAME, NAME@VERSION, a suite
    file, or a shipped suite such as smoke), without holding training back."""

    suite: str | None = None
    every: int = 0
    # At most this many of an eval's episodes play at once, across its environments (every eval: `rollout eval
    # run`, schedules, and a training run's): each is a workflow and an activity on the runners' Temporal.
    episodes_in_flight: int = defaults.EVAL_EPISODES_IN_FLIGHT
    gate: EvalGateSettings = field(default_factory=EvalGateSettings)


class TrackingBackend(StrEnum):
    wandb = "wandb"  # Weights & Biases (the tracking extra)
    mlflow = "mlflow"  # MLflow: a tracking server, or a local store under the data directory


class WandbMode(StrEnum):
    online = "online"
    offline = "offline"  # files only, under the runner's data directory; `wandb sync` them later


@dataclass
class WandbSettings:
    """A run's W&B run. The API key is W&B's own: `WANDB_API_KEY` (or `wandb login`) where the stack's runners
    start, never a setting."""

    project: str = "rollout"
    entity: str | None = None  # None: the key's default entity
    mode: WandbMode = WandbMode.online
    name: str | None = None  # the run's display name (None: the rollout run's id)
    group: str | None = None
    tags: list[str] = field(default_factory=list[str])


@dataclass
class MlflowSettings:
    """A run's MLflow run. Credentials are MLflow's own (`MLFLOW_TRACKING_TOKEN`, or
    `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD`) where the stack's runners start, never a
    setting."""

    tracking_uri: str | None = None  # None: a local store under the data directory (sqlite)
    experiment: str = "rollout"
    run_name: str | None = None  # None: the rollout run's id
    tags: dict[str, str] = field(default_factory=dict[str, str])


@dataclass
class TrackingSettings:
    """Where a training run's metrics go beside the ledger (rollout.tracking, docs/monitor.md)."""

    backends: list[TrackingBackend] = field(default_factory=list[TrackingBackend])
    # Every this many steps a table of sample transcripts goes to each backend (0: none).
    samples_every: int = 10
    samples: int = 4  # episodes in each table
    wandb: WandbSettings = field(default_factory=WandbSettings)
    mlflow: MlflowSettings = field(default_factory=MlflowSettings)
    # An OpenTelemetry collector's OTLP/HTTP endpoint (`http://HOST:4318`): each episode's and step's spans go
    # there (rollout.tracking.traces). Headers (an API key) are OpenTelemetry's own
    # `OTEL_EXPORTER_OTLP_HEADERS` where the stack's runners start, never a setting.
    otlp_endpoint: str | None = None


@dataclass
class Settings:
    data_dir: str = MISSING
    services: ServiceSettings = field(default_factory=ServiceSettings)
    models_dir: str = MISSING
    log_level: LogLevel = LogLevel.INFO
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    run: RunDefaults = field(default_factory=RunDefaults)
    eval: EvalSettings = field(default_factory=EvalSettings)
    gpu: GpuSettings = field(default_factory=GpuSettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    # A policy's own base model and trainer settings, by policy name (`policies.listener.model=tiny-qwen3`).
    policies: dict[str, PolicySettings] = field(default_factory=dict[str, PolicySettings])

    @property
    def engine_kind(self) -> EngineKind:
        """The engine the stack starts: services.engine.kind, where `auto` follows the trainer's provider."""
        kind = self.services.engine.kind
        if kind != EngineKind.auto:
            return kind
        return EngineKind.tinker if self.trainer.provider == TrainerProvider.tinker else EngineKind.local

    @property
    def gpu_lease(self) -> str | None:
        """The GPU lease engines give way to and the trainer holds while it steps (one-GPU mode), if any."""
        if self.trainer.gpu_lease:
            return self.trainer.gpu_lease
        return self.gpu.name if self.gpu.mode == GpuMode.shared else None

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    def _embedded_login(self, user: str) -> str:
        """`user`, with the embedded server's password for it once the server has made one."""
        password = known_ledger_password(self.data_path, user)
        return f"{user}:{password}" if password else user

    @property
    def ledger_url(self) -> str:
        """The owner's URL: `services.postgres.url`, or the embedded server's `postgres` with its password."""
        return self.services.postgres.url or self._embedded_url("postgres")

    @property
    def worker_ledger_url(self) -> str:
        """The URL services connect with: `services.postgres.worker_url`; else, on the embedded server, the
        worker role (`LEDGER_WORKER_ROLE`); else (a server of your own, `services.postgres.url`) that URL."""
        postgres = self.services.postgres
        return postgres.worker_url or postgres.url or self._embedded_url(LEDGER_WORKER_ROLE)

    @property
    def reader_ledger_url(self) -> str:
        """The URL the dashboard reads with: `services.postgres.reader_url`; else, on the embedded server, the
        read-only role (`LEDGER_READER_ROLE`); else (a server of your own) `worker_ledger_url`."""
        return self._narrow_url(self.services.postgres.reader_url, LEDGER_READER_ROLE)

    @property
    def sandbox_ledger_url(self) -> str:
        """The URL sandbox hosts connect with: `services.postgres.sandbox_url`; else, on the embedded server,
        the sandbox role (`LEDGER_SANDBOX_ROLE`); else (a server of your own) `worker_ledger_url`."""
        return self._narrow_url(self.services.postgres.sandbox_url, LEDGER_SANDBOX_ROLE)

    def writer_ledger_url(self, writer: LedgerWriter) -> str:
        """The URL a writer kind's service connects with: `services.postgres.<writer>_url`; else, on the
        embedded server, its own role (`writer.role`); else (a server of your own) `worker_ledger_url`."""
        return self._narrow_url(getattr(self.services.postgres, f"{writer.value}_url"), writer.role)

    @property
    def service_ledger_urls(self) -> tuple[str, ...]:
        """Every URL a service connects with (never the owner's): the worker's, the reader's, the sandbox
        hosts' and each writer kind's."""
        writers = tuple(self.writer_ledger_url(writer) for writer in LedgerWriter)
        return (self.worker_ledger_url, self.reader_ledger_url, self.sandbox_ledger_url, *writers)

    def _narrow_url(self, given: str | None, role: str) -> str:
        postgres = self.services.postgres
        if given:
            return given
        if postgres.url or postgres.worker_url:
            return self.worker_ledger_url
        return self._embedded_url(role)

    def _embedded_url(self, user: str) -> str:
        """The embedded server's URL for `user` (with its password once the server has made one)."""
        postgres = self.services.postgres
        return (
            f"postgresql://{self._embedded_login(user)}@{postgres.host}:{postgres.port}/{postgres.database}"
        )

    @property
    def temporal_address(self) -> str:
        temporal = self.services.temporal
        return temporal.address or f"{temporal.host}:{temporal.port}"

    @property
    def temporal_ui_url(self) -> str | None:
        temporal = self.services.temporal
        if temporal.address:
            return temporal.ui_url
        return f"http://{temporal.host}:{temporal.ui_port}"

    @property
    def blob_url(self) -> str:
        return self.services.blobs.url or (self.data_path / "blobs").as_uri()
