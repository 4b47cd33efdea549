"""Configuration: Hydra composes `rollout/conf` with command-line overrides into typed `Settings`.

Contract:
- `load(overrides)` returns validated settings or raises `ConfigError`, whose message names the offending key
  and, for an unknown key, the keys that are valid there; for a bad value, what is expected (a type, or a
  value a service would refuse at start: `services.engine.vllm_max_lora_rank` outside vLLM's choices, a
  negative `run.max_lag`, any numeric setting outside its range, NaN and infinity included, such as
  `trainer.groups_per_batch=0`, which would play episodes forever and never train: the message gives the
  range). One line, before anything starts.
- The schema (`Settings`, each `policies.NAME` a rollout.config.policies.PolicySettings) is the single place a
  key and its type are declared; YAML only sets values. `policies.NAME.KEY=VALUE` needs no `+`.
- `rollout.config.overrides` writes settings back out as overrides that `load` reads as they were.

Its modules: `schema` (every key, its type and default), `loading` (composing and reading the schema back)
and `checks` (every value checked when settings load; `ConfigError`, the one error), whose public names this
package gives; `defaults` (one default per run setting), `policies` (one policy's own settings), `overrides`
(settings written back as `key=value`), `presets` (presets kept in the ledger), `catalog` (the models presets
name) and `budget` (whether an engine and a trainer fit one GPU's memory).

Importing the package imports none of them: each public name loads its module when first used, so workflow
code, which imports `defaults` and `overrides` and must stay light, never brings Hydra or the schema with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.config.checks import (
        ConfigError as ConfigError,
    )
    from rollout.config.checks import (
        loss_config as loss_config,
    )
    from rollout.config.loading import (
        LOSS_PARAMS_PREFIX as LOSS_PARAMS_PREFIX,
    )
    from rollout.config.loading import (
        as_dict as as_dict,
    )
    from rollout.config.loading import (
        load as load,
    )
    from rollout.config.loading import (
        valid_keys as valid_keys,
    )
    from rollout.config.schema import (
        LEDGER_READER_ROLE as LEDGER_READER_ROLE,
    )
    from rollout.config.schema import (
        LEDGER_SANDBOX_ROLE as LEDGER_SANDBOX_ROLE,
    )
    from rollout.config.schema import (
        LEDGER_WORKER_ROLE as LEDGER_WORKER_ROLE,
    )
    from rollout.config.schema import (
        SERVICE_LEDGER_ROLES as SERVICE_LEDGER_ROLES,
    )
    from rollout.config.schema import (
        BlobSettings as BlobSettings,
    )
    from rollout.config.schema import (
        EngineKind as EngineKind,
    )
    from rollout.config.schema import (
        EngineSettings as EngineSettings,
    )
    from rollout.config.schema import (
        EvalGateSettings as EvalGateSettings,
    )
    from rollout.config.schema import (
        EvalSettings as EvalSettings,
    )
    from rollout.config.schema import (
        GateAction as GateAction,
    )
    from rollout.config.schema import (
        GatewaySettings as GatewaySettings,
    )
    from rollout.config.schema import (
        GpuMode as GpuMode,
    )
    from rollout.config.schema import (
        GpuSettings as GpuSettings,
    )
    from rollout.config.schema import (
        LedgerWriter as LedgerWriter,
    )
    from rollout.config.schema import (
        LogLevel as LogLevel,
    )
    from rollout.config.schema import (
        MlflowSettings as MlflowSettings,
    )
    from rollout.config.schema import (
        MonitorSettings as MonitorSettings,
    )
    from rollout.config.schema import (
        PostgresSettings as PostgresSettings,
    )
    from rollout.config.schema import (
        RoutingMode as RoutingMode,
    )
    from rollout.config.schema import (
        RoutingSettings as RoutingSettings,
    )
    from rollout.config.schema import (
        RunDefaults as RunDefaults,
    )
    from rollout.config.schema import (
        SandboxIsolation as SandboxIsolation,
    )
    from rollout.config.schema import (
        SandboxSettings as SandboxSettings,
    )
    from rollout.config.schema import (
        ServiceSettings as ServiceSettings,
    )
    from rollout.config.schema import (
        Settings as Settings,
    )
    from rollout.config.schema import (
        TemporalSettings as TemporalSettings,
    )
    from rollout.config.schema import (
        TrackingBackend as TrackingBackend,
    )
    from rollout.config.schema import (
        TrackingSettings as TrackingSettings,
    )
    from rollout.config.schema import (
        TrainerProvider as TrainerProvider,
    )
    from rollout.config.schema import (
        TrainerSettings as TrainerSettings,
    )
    from rollout.config.schema import (
        WandbMode as WandbMode,
    )
    from rollout.config.schema import (
        WandbSettings as WandbSettings,
    )

# Each public name's module, imported on first use: workflow code imports `rollout.config.defaults` and
# `rollout.config.overrides`, and importing this package must not bring Hydra or the schema with them.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("ConfigError", "loss_config"), "rollout.config.checks"),
    **dict.fromkeys(("LOSS_PARAMS_PREFIX", "as_dict", "load", "valid_keys"), "rollout.config.loading"),
    **dict.fromkeys(
        (
            "BlobSettings",
            "EngineKind",
            "EngineSettings",
            "EvalGateSettings",
            "EvalSettings",
            "GateAction",
            "GatewaySettings",
            "GpuMode",
            "GpuSettings",
            "LEDGER_READER_ROLE",
            "LEDGER_SANDBOX_ROLE",
            "LEDGER_WORKER_ROLE",
            "LedgerWriter",
            "LogLevel",
            "MlflowSettings",
            "MonitorSettings",
            "PostgresSettings",
            "RoutingMode",
            "RoutingSettings",
            "RunDefaults",
            "SERVICE_LEDGER_ROLES",
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
        ),
        "rollout.config.schema",
    ),
}

# For `import *` and the API reference; pyright reads the names from the imports above.
__all__ = sorted(_HOMES)  # pyright: ignore[reportUnsupportedDunderAll]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rollout.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
