"""Per-policy settings: `policies.NAME.model`, `.lora_rank` and `.learning_rate`, one policy's own base model
and trainer settings over `trainer.*` and over the environment's `policy_models`.

Contract:
- `PolicySettings` is the schema of one policy's entry (`Settings.policies` maps names to it): its base
  model, LoRA rank, learning rate, and the task queue of the trainer worker that trains it.
- `set_policies(composed, overrides)` applies `policies.NAME.KEY=VALUE` overrides to a composed config, making
  NAME's entry when none exists (Hydra adds no key to a typed mapping from the command line without a `+`,
  which no user should need); an override that names no policy or no key raises `BadPolicySetting`, one line
  naming it and the keys there are. A bad value is left to the schema's own check.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf, open_dict

POLICIES_PREFIX = "policies."


@dataclass
class PolicySettings:
    """One policy's own base model and trainer settings (`policies.NAME.*`), over `trainer.*` and over the
    environment's `policy_models`: a policy that sets none trains and samples `trainer.model`."""

    model: str | None = None  # smollm2, tiny-qwen3, a catalog model, an HF id or a local path
    lora_rank: int | None = None  # None: trainer.lora_rank
    learning_rate: float | None = None  # None: trainer.learning_rate
    # The task queue of a trainer worker of its own (`rollout worker trainer --task-queue QUEUE`; on a
    # cluster, the chart's `rollout-trainer-MODEL` of a policyModels entry with a trainer); None: the stack's.
    trainer_queue: str | None = None


class BadPolicySetting(ValueError):
    """A `policies.*` override names no policy or no key; the message says how to write one."""


def policy_keys() -> list[str]:
    """The keys a policy's entry has."""
    return [str(key) for key in OmegaConf.structured(PolicySettings)]


def set_policies(composed: DictConfig, overrides: list[str]) -> None:
    """Apply `policies.NAME.KEY=VALUE` overrides to `composed`, making NAME's entry where none exists."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        parsed = parser.parse_override(override)
        _, name, key = (
            parsed.key_or_group.split(".", 2) if parsed.key_or_group.count(".") >= 2 else ("", "", "")
        )
        if not name or not key:
            raise BadPolicySetting(
                f"bad setting '{parsed.key_or_group}': write policies.NAME.KEY=VALUE (e.g. "
                f"policies.listener.model=tiny-qwen3); keys: {', '.join(policy_keys())}"
            )
        if name not in composed.policies:
            with open_dict(composed.policies):
                composed.policies[name] = OmegaConf.structured(PolicySettings)
        OmegaConf.update(composed, parsed.key_or_group, parsed.value(), merge=False)
