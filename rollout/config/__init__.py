"""Configuration: Hydra composes `rollout/conf` with command-line overrides into typed `Settings`.

Contract:
- `load(overrides)` returns validated settings or raises `ConfigError`, whose message names the offending key
  and, for an unknown key, the keys that are valid there; for a bad value, what is expected (a type, or a
  value a service would refuse at start: `services.engine.vllm_max_lora_rank` outside vLLM's choices, a
  negative `run.max_lag`, any numeric setting outside its range, NaN and infinity included, such as
  `trainer.groups_per_batch=0`, which would play episodes forever and never train: the message gives the
  range). One line, before anything starts.
- The schema (`Settings`, each `policies.NAME` a rollout.policy_settings.PolicySettings) is the single place a
  key and its type are declared; YAML only sets values. `policies.NAME.KEY=VALUE` needs no `+`.
- `rollout.overrides` writes settings back out as overrides that `load` reads as they were.

Its modules, behind this one public API: `schema` (every key, its type and default), `loading` (composing and
reading the schema back) and `checks` (every value checked when settings load; `ConfigError`, the one error).
"""

from rollout.config.checks import ConfigError, loss_config
from rollout.config.loading import LOSS_PARAMS_PREFIX, as_dict, load, valid_keys
from rollout.config.schema import (
    LEDGER_READER_ROLE,
    LEDGER_SANDBOX_ROLE,
    LEDGER_WORKER_ROLE,
    SERVICE_LEDGER_ROLES,
    BlobSettings,
    EngineKind,
    EngineSettings,
    EvalGateSettings,
    EvalSettings,
    GateAction,
    GatewaySettings,
    GpuMode,
    GpuSettings,
    LedgerWriter,
    LogLevel,
    MlflowSettings,
    MonitorSettings,
    PostgresSettings,
    RoutingMode,
    RoutingSettings,
    RunDefaults,
    SandboxIsolation,
    SandboxSettings,
    ServiceSettings,
    Settings,
    TemporalSettings,
    TrackingBackend,
    TrackingSettings,
    TrainerProvider,
    TrainerSettings,
    WandbMode,
    WandbSettings,
)

__all__ = [
    "LEDGER_READER_ROLE",
    "LEDGER_SANDBOX_ROLE",
    "LEDGER_WORKER_ROLE",
    "LOSS_PARAMS_PREFIX",
    "SERVICE_LEDGER_ROLES",
    "BlobSettings",
    "ConfigError",
    "EngineKind",
    "EngineSettings",
    "EvalGateSettings",
    "EvalSettings",
    "GateAction",
    "GatewaySettings",
    "GpuMode",
    "GpuSettings",
    "LedgerWriter",
    "LogLevel",
    "MlflowSettings",
    "MonitorSettings",
    "PostgresSettings",
    "RoutingMode",
    "RoutingSettings",
    "RunDefaults",
    "SandboxIsolation",
    "SandboxSettings",
    "ServiceSettings",
    "Settings",
    "TemporalSettings",
    "TrackingBackend",
    "TrackingSettings",
    "TrainerProvider",
    "TrainerSettings",
    "WandbMode",
    "WandbSettings",
    "as_dict",
    "load",
    "loss_config",
    "valid_keys",
]
