"""Each policy's base model and trainer settings for a run: the config's `policies.NAME.*`, over the
environment's `policy_models`, over `trainer.*`.

Contract:
- `sampled_policies(environment)`: the policies the run's engines serve (every agent's but those an external
  model answers), trained or pinned.
- `own_models(settings, environment)`: the policies on a model, trainer settings or a trainer of their own
  (`trainer_queue`), by name, as `TrainingSpec.models` carries them; a policy with none of its own is left
  out.
- `base_models(settings, environment)`: every base model the run's policies sample, `trainer.model` first.
- `policy_models(settings, environment)`: the run's `RunSettings.policy_models`, every sampled
  policy's model, when any policy is on a model other than `trainer.model` (the gateway then routes and
  renders each policy by its model); none otherwise.
- `models_said(settings, environment)`: the models the run trains, in words, for the command line.
- `check_policy_models(settings, environment)` refuses, in one line naming the setting, a `policies.NAME` no
  agent of the environment plays, a model rollout does not know (built in, in the catalog, a local folder or
  an HF id `org/name`), a policy's own model or rank with Tinker (one hosted model per run), and on vLLM a
  policy's rank above `services.engine.vllm_max_lora_rank` or its full weights (`lora_rank=0`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.control.errors import ControlError

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.environment import Environment
    from rollout.workflows.training_types import PolicyModel

_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def sampled_policies(environment: Environment) -> list[str]:
    return list(dict.fromkeys(agent.policy for agent in environment.agents if agent.model is None))


def _model_of(settings: Settings, environment: Environment, policy: str) -> str:
    own = settings.policies.get(policy)
    return (own.model if own else None) or environment.policy_models.get(policy) or settings.trainer.model


def own_models(settings: Settings, environment: Environment) -> dict[str, PolicyModel]:
    from rollout.workflows.training_types import PolicyModel

    found: dict[str, PolicyModel] = {}
    for policy in sampled_policies(environment):
        own = settings.policies.get(policy)
        model = _model_of(settings, environment, policy)
        rank, rate, queue = (
            (own.lora_rank, own.learning_rate, own.trainer_queue) if own else (None, None, None)
        )
        if model != settings.trainer.model or rank is not None or rate is not None or queue:
            found[policy] = PolicyModel(
                model=model, lora_rank=rank, learning_rate=rate, task_queue=queue or None
            )
    return found


def base_models(settings: Settings, environment: Environment) -> list[str]:
    models = [_model_of(settings, environment, policy) for policy in sampled_policies(environment)]
    return list(dict.fromkeys([settings.trainer.model, *models]))


def policy_models(settings: Settings, environment: Environment) -> dict[str, str]:
    if len(base_models(settings, environment)) < 2:
        return {}
    return {policy: _model_of(settings, environment, policy) for policy in sampled_policies(environment)}


def models_said(settings: Settings, environment: Environment) -> str:
    """The models the run trains, in words: `smollm2`, or `speaker on smollm2, listener on tiny-qwen3`."""
    if len(base_models(settings, environment)) < 2:
        return settings.trainer.model
    return ", ".join(f"{p} on {_model_of(settings, environment, p)}" for p in sampled_policies(environment))


def known_model(spec: str) -> bool:
    from rollout.config.catalog import CATALOG
    from rollout.engines.models import BUILTIN

    return (
        spec in BUILTIN or spec in CATALOG or Path(spec).expanduser().is_dir() or bool(_HF_ID.fullmatch(spec))
    )


def check_policy_models(settings: Settings, environment: Environment) -> None:
    from rollout.config.catalog import CATALOG
    from rollout.engines.models import BUILTIN

    policies = sampled_policies(environment)
    for policy in settings.policies:
        if policy not in policies:
            raise ControlError(
                f"policies.{policy}: {environment.name} has no policy {policy!r} (its policies: "
                f"{', '.join(policies)})",
                usage=True,
            )
    for policy in policies:
        model = _model_of(settings, environment, policy)
        if not known_model(model):
            where = (
                f"policies.{policy}.model={model}"
                if settings.policies.get(policy) and settings.policies[policy].model
                else f"{environment.name}'s policy_models[{policy!r}]={model}"
            )
            raise ControlError(
                f"{where} names no model rollout knows: give {', '.join(BUILTIN)}, a catalog model "
                f"({', '.join(CATALOG)}), an HF id (org/name) or a local folder",
                usage=True,
            )
    own = own_models(settings, environment)
    if own and settings.trainer.provider == "tinker":
        raise ControlError(
            f"policies {', '.join(own)} set a model or trainer settings of their own, which the Tinker trainer "
            "does not take (one hosted model per run): use the local trainer, or leave policies.* unset",
            usage=True,
        )
    if settings.engine_kind != "vllm":
        return
    most = settings.services.engine.vllm_max_lora_rank
    for policy, chosen in own.items():
        if chosen.lora_rank == 0:
            raise ControlError(
                f"policies.{policy}.lora_rank=0 trains full weights, which services.engine.kind=vllm cannot "
                "serve yet: give it a LoRA rank, or serve on services.engine.kind=local",
                usage=True,
            )
        if chosen.lora_rank is not None and chosen.lora_rank > most:
            raise ControlError(
                f"policies.{policy}.lora_rank={chosen.lora_rank} is above what vLLM loads "
                f"(services.engine.vllm_max_lora_rank={most}): raise that, or lower the rank",
                usage=True,
            )
