"""What the settings' types cannot say: values a service would refuse only once it starts, checked as the
settings load (rollout.config.load turns `BadSettingValue` into its `ConfigError`).

Contract: `check_values(settings)` returns, or raises `BadSettingValue` whose one-line message names the key,
what is wrong with its value and what to set instead.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rollout.run_settings import BadRunSetting, failure_bound_of, max_lag_of

if TYPE_CHECKING:
    from rollout.config import Settings

# vLLM 0.33's choices for `--max-lora-rank` (its argument parser refuses any other at `vllm serve`).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class BadSettingValue(ValueError):
    """A setting's value is one no service would take; the message says which and what would be right."""


def check_values(settings: Settings) -> None:
    """What the schema's types cannot say: values a service would refuse only once it starts."""
    try:
        max_lag_of(settings.run.max_lag, "run.max_lag")
        failure_bound_of(settings.run.max_failure_rate, settings.run.failure_window, "run.")
    except BadRunSetting as error:
        raise BadSettingValue(str(error)) from None
    gateway = settings.services.gateway
    if gateway.default_max_tokens < 1:
        raise BadSettingValue(
            f"bad value for 'services.gateway.default_max_tokens': {gateway.default_max_tokens} leaves a turn "
            "no tokens to sample; set it to 1 or more"
        )
    if gateway.max_turns_in_flight_per_seat < 1:
        raise BadSettingValue(
            "bad value for 'services.gateway.max_turns_in_flight_per_seat': "
            f"{gateway.max_turns_in_flight_per_seat} would refuse every turn; set it to 1 or more"
        )
    gate = settings.eval.gate
    if gate.max_drop is not None and (gate.max_drop < 0 or gate.max_drop != gate.max_drop):
        raise BadSettingValue(
            f"bad value for 'eval.gate.max_drop': {gate.max_drop} is not a drop in score; set 0 or more (0.05: a "
            "drop of more than 0.05 in any environment's score trips the gate)"
        )
    if gate.max_drop is not None and (settings.eval.suite is None or settings.eval.every < 1):
        raise BadSettingValue(
            "bad value for 'eval.gate.max_drop': it gates a suite the run does not evaluate; set eval.suite=SUITE "
            "and eval.every=N too, or leave eval.gate.max_drop unset"
        )
    pool = settings.sandbox.command_pool
    if pool and not re.fullmatch(r"command(#[A-Za-z0-9_-]{1,64})?", pool):
        raise BadSettingValue(
            f"bad value for 'sandbox.command_pool': {pool!r} is not a pool of command hosts; set `command` (or "
            "`command#SUFFIX` for a pool of its own), or leave it empty to run command seats in the runner's jail"
        )
    if settings.services.engine.opponent_adapters < 0:
        raise BadSettingValue(
            "bad value for 'services.engine.opponent_adapters': "
            f"{settings.services.engine.opponent_adapters} is not a number of adapters; set 0 or more (0: an "
            "opponent is unloaded as soon as its last episode ends)"
        )
    rank = settings.services.engine.vllm_max_lora_rank
    if rank not in VLLM_LORA_RANKS:
        choices = ", ".join(str(choice) for choice in VLLM_LORA_RANKS)
        raise BadSettingValue(
            f"bad value for 'services.engine.vllm_max_lora_rank': {rank} is not a rank vLLM serves; "
            f"choose one of {choices} (at least trainer.lora_rank)"
        )
