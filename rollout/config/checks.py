"""What the schema's types cannot say, checked once when settings load: values a service would refuse only
once it starts (a LoRA rank vLLM does not serve, a negative max_lag), a loss and its parameters (and whether
the trainer's provider has it), the tracking backends, and every numeric setting's range. Each failure is a
`ConfigError` of one line naming the setting and, for a number, its range.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from rollout.config.overrides import setting_at
from rollout.config.schema import Settings, TrackingSettings, TrainerProvider, TrainerSettings
from rollout.rl.advantages import AdvantageError, advantage_from
from rollout.rl.losses.core import LossConfig
from rollout.rl.losses.registry import LossError, loss_from, on_tinker
from rollout.run.settings import BadRunSetting, failure_bound_of, max_lag_of

# vLLM 0.33's choices for `--max-lora-rank` (its argument parser refuses any other at `vllm serve`).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and what would be right."""


def check_values(settings: Settings) -> None:
    """What the schema's types cannot say: values a service would refuse only once it starts."""
    try:
        max_lag_of(settings.run.max_lag, "run.max_lag")
        failure_bound_of(settings.run.max_failure_rate, settings.run.failure_window, "run.")
    except BadRunSetting as error:
        raise ConfigError(str(error)) from None
    _check_ranges(settings)
    trainer = settings.trainer
    if trainer.quantization not in (None, "nf4"):
        raise ConfigError(
            f"bad value for 'trainer.quantization': {trainer.quantization!r} is not a quantization the trainer "
            "knows; set nf4 (QLoRA: the base in 4 bits, on a CUDA GPU) or leave it unset"
        )
    _check_loss(trainer)
    if trainer.quantization and not trainer.lora_rank:
        raise ConfigError(
            "bad value for 'trainer.quantization': nf4 trains LoRA adapters on a frozen 4-bit base, and "
            "trainer.lora_rank=0 trains the full weights; set trainer.lora_rank=8 (or more), or leave "
            "trainer.quantization unset"
        )
    gate = settings.eval.gate
    if gate.max_drop is not None and (settings.eval.suite is None or settings.eval.every < 1):
        raise ConfigError(
            "bad value for 'eval.gate.max_drop': it gates a suite the run does not evaluate; set eval.suite=SUITE "
            "and eval.every=N too, or leave eval.gate.max_drop unset"
        )
    pool = settings.sandbox.command_pool
    if pool and not re.fullmatch(r"command(#[A-Za-z0-9_-]{1,64})?", pool):
        raise ConfigError(
            f"bad value for 'sandbox.command_pool': {pool!r} is not a pool of command hosts; set `command` (or "
            "`command#SUFFIX` for a pool of its own), or leave it empty to run command seats in the runner's jail"
        )
    temporal = settings.services.temporal
    if bool(temporal.tls_cert) != bool(temporal.tls_key):
        raise ConfigError(
            "bad value for 'services.temporal.tls_cert' and 'tls_key': a client certificate needs its key, and a "
            "key its certificate; set both (mutual TLS) or neither"
        )
    for folder in settings.sandbox.command_readable:
        if not folder.startswith("/"):
            raise ConfigError(
                f"bad value for 'sandbox.command_readable': {folder!r} is not an absolute folder; name folders "
                "from the root, e.g. sandbox.command_readable=[/srv/agents]"
            )
    _check_tracking(settings.tracking)
    rank = settings.services.engine.vllm_max_lora_rank
    if rank not in VLLM_LORA_RANKS:
        choices = ", ".join(str(choice) for choice in VLLM_LORA_RANKS)
        raise ConfigError(
            f"bad value for 'services.engine.vllm_max_lora_rank': {rank} is not a rank vLLM serves; "
            f"choose one of {choices} (at least trainer.lora_rank)"
        )


def _check_loss(trainer: TrainerSettings) -> None:
    try:
        advantage_from(trainer.advantage)
    except AdvantageError as error:
        raise ConfigError(f"bad value for 'trainer.advantage': {error}") from None
    try:
        loss = loss_from(trainer.loss, trainer.loss_params)
    except LossError as error:
        key = "trainer.loss_params" if error.in_params else "trainer.loss"
        raise ConfigError(f"bad value for '{key}': {error}") from None
    bounds = trainer.token_mask_bounds
    if bounds is not None and not (len(bounds) == 2 and 0 <= bounds[0] < 1 < bounds[1] < math.inf):
        raise ConfigError(
            f"bad value for 'trainer.token_mask_bounds': {bounds} are not IcePop's bounds on π_θ/μ; set [lo, hi] "
            "with 0 ≤ lo < 1 < hi (e.g. [0.5,2.0]), or leave it unset"
        )
    if trainer.provider == TrainerProvider.tinker and loss.tinker is None:
        raise ConfigError(
            f"bad value for 'trainer.loss': Tinker has no loss like {trainer.loss}; on trainer.provider=tinker "
            f"choose {on_tinker()}"
        )
    if trainer.provider == TrainerProvider.tinker and bounds is not None:
        raise ConfigError(
            "bad value for 'trainer.token_mask_bounds': Tinker's losses mask no token by its ratio; leave it unset "
            "on trainer.provider=tinker"
        )


def loss_config(trainer: TrainerSettings) -> LossConfig:
    """The loss `trainer` names, with its parameters and IcePop's bounds (checked when the settings
    loaded)."""
    bounds = trainer.token_mask_bounds
    return LossConfig(
        loss_from(trainer.loss, trainer.loss_params),
        token_mask_bounds=None if bounds is None else (bounds[0], bounds[1]),
    )


def _check_tracking(tracking: TrackingSettings) -> None:
    uri = tracking.mlflow.tracking_uri
    if uri is not None:
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https", "sqlite", "postgresql", "mysql", "databricks"):
            raise ConfigError(
                f"bad value for 'tracking.mlflow.tracking_uri': {uri!r} is not an MLflow tracking URI; give a "
                "server (http://HOST:PORT) or a database (sqlite:///PATH), or leave it unset for a local store "
                "under the data directory"
            )
        if parts.password or (parts.username and parts.scheme in ("http", "https")):
            raise ConfigError(
                "bad value for 'tracking.mlflow.tracking_uri': it holds credentials, which would be recorded with "
                "the run; give the URI without it and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
                "(or MLFLOW_TRACKING_TOKEN) where the stack starts"
            )
    endpoint = tracking.otlp_endpoint
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ConfigError(
                f"bad value for 'tracking.otlp_endpoint': {endpoint!r} is not an OTLP/HTTP endpoint; give a "
                "collector's URL (http://HOST:4318, or its .../v1/traces), or leave it unset for no traces"
            )
        if parts.username or parts.password:
            raise ConfigError(
                "bad value for 'tracking.otlp_endpoint': it holds credentials, which would be recorded with the "
                "run; give the URL without them and set OTEL_EXPORTER_OTLP_HEADERS where the stack starts"
            )


@dataclass(frozen=True)
class _Range:
    """A numeric setting's valid values (`holds`; None where the schema allows it) and what its message says
    after the bad value: why it is wrong, and the range to set."""

    holds: Callable[[float], bool]
    said: str

    def check(self, key: str, value: float | None) -> None:
        if value is not None and not (math.isfinite(value) and self.holds(value)):
            raise ConfigError(f"bad value for '{key}': {value} {self.said}")


def _at_least(low: float, said: str) -> _Range:
    return _Range(lambda v: v >= low, said)


def _above_zero(said: str) -> _Range:
    return _Range(lambda v: v > 0, said)


_PORT = _Range(lambda v: 1 <= v <= 65535, "is not a TCP port; set 1 to 65535")
_LORA_RANK = _at_least(0, "is not a rank; set 1 or more (0: train the full weights)")
_LEARNING_RATE = _above_zero("would never move the weights; set a positive number (1e-5)")

# Every numeric setting but run.max_lag, run.max_failure_rate and run.failure_window (rollout.run.settings
# checks those, wherever they enter) and services.engine.vllm_max_lora_rank (one of vLLM's choices), by key.
# tests/test_config.py walks the schema: a numeric setting missing here fails it.
_RANGES: dict[str, _Range] = {
    "services.postgres.port": _PORT,
    "services.temporal.port": _PORT,
    "services.temporal.ui_port": _PORT,
    "services.gateway.port": _PORT,
    "services.gateway.engine_port": _PORT,
    "services.monitor.port": _PORT,
    "services.gateway.max_context": _at_least(
        1, "leaves no room for a prompt; set the model's context, 1 or more"
    ),
    "services.gateway.outage_window_s": _at_least(
        0, "is not a number of seconds; set 0 or more (0: a turn fails at the first outage)"
    ),
    "services.gateway.max_request_bytes": _at_least(
        1, "would refuse every request; set 1 or more bytes (4194304: 4 MiB)"
    ),
    "services.gateway.default_max_tokens": _at_least(1, "leaves a turn no tokens to sample; set 1 or more"),
    "services.gateway.max_turns_in_flight_per_seat": _at_least(1, "would refuse every turn; set 1 or more"),
    "services.engine.opponent_adapters": _at_least(
        0,
        "is not a number of adapters; set 0 or more (0: an opponent is unloaded as soon as its last episode ends)",
    ),
    "services.engine.prefix_cache_mb": _at_least(0, "is not a size; set 0 or more MiB (0: no prefix cache)"),
    "services.engine.replicas": _at_least(1, "would start no engine; set 1 or more"),
    "services.engine.vllm_gpu_memory_utilization": _Range(
        lambda v: 0 < v <= 1, "is not a share of the GPU; set above 0 and at most 1 (0.85)"
    ),
    "services.engine.vllm_max_model_len": _at_least(1, "leaves no room for a prompt; set 1 or more tokens"),
    "services.engine.vllm_max_loras": _at_least(1, "would hold no adapter; set 1 or more"),
    "services.engine.vllm_max_num_seqs": _at_least(1, "would schedule no sequence; set 1 or more"),
    "routing.affinity_slack": _at_least(
        1,
        "would never keep a conversation on its engine; set 1 or more (or routing.mode=rotate for no affinity)",
    ),
    "gpu.memory_gib": _above_zero("is not a size; set the device's memory in GiB, above 0"),
    "gpu.sequences": _at_least(1, "would hold no sequence; set 1 or more"),
    "gpu.sampled_tokens": _at_least(1, "would sample nothing; set 1 or more tokens"),
    "trainer.steps": _at_least(1, "would train no step; set 1 or more"),
    "trainer.groups_per_batch": _at_least(
        1, "would play episodes forever and never train; set 1 or more groups per step"
    ),
    "trainer.refill_max": _at_least(
        0, "is not a number of groups; set 0 or more tied groups a step may replace (or trainer.refill=false)"
    ),
    "trainer.seed": _at_least(0, "is not a seed; set 0 or more"),
    "trainer.lora_rank": _LORA_RANK,
    "trainer.lora_alpha": _at_least(
        1, "would scale the adapter to nothing; set 1 or more (often twice the rank)"
    ),
    "trainer.learning_rate": _LEARNING_RATE,
    "trainer.max_grad_norm": _above_zero("would clip every gradient to nothing; set a positive number (1.0)"),
    "trainer.micro_batch_tokens": _at_least(1, "would fit no token; set 1 or more"),
    "trainer.updates_per_batch": _at_least(1, "is how many optimiser steps each batch takes; set 1 or more"),
    "trainer.lease_ttl_s": _above_zero(
        "would lose the trainer's lease at once; set a positive number of seconds"
    ),
    "trainer.data_parallel_workers": _at_least(1, "is how many workers train each step; set 1 or more"),
    "run.groups_in_flight": _at_least(1, "would play no episode; set 1 or more groups"),
    "run.max_tokens": _at_least(1, "leaves a turn no tokens to sample; set 1 or more"),
    "eval.every": _at_least(0, "is not a number of checkpoints; set 0 or more (0: no evals during training)"),
    "eval.episodes_in_flight": _at_least(1, "would play no episode; set 1 or more"),
    "eval.gate.max_drop": _at_least(
        0,
        "is not a drop in score; set 0 or more (0.05: a drop of more than 0.05 in any environment's score trips "
        "the gate)",
    ),
    "tracking.samples_every": _at_least(
        0, "is not a number of steps; set 0 or more steps between tables of sample transcripts (0: no tables)"
    ),
    "tracking.samples": _at_least(0, "is not a number of episodes; set 0 or more episodes per table"),
}
# A policy's own (policies.NAME.KEY), by KEY: the same ranges as the trainer's.
_POLICY_RANGES: dict[str, _Range] = {"lora_rank": _LORA_RANK, "learning_rate": _LEARNING_RATE}


def _check_ranges(settings: Settings) -> None:
    for key, valid in _RANGES.items():
        valid.check(key, setting_at(settings, key))
    for name, policy in settings.policies.items():
        for key, valid in _POLICY_RANGES.items():
            valid.check(f"policies.{name}.{key}", getattr(policy, key))
