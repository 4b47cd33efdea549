"""Loading settings: Hydra composes rollout/conf with the command line's overrides into the schema, then
every value is checked (rollout.config.checks); `as_dict` and `valid_keys` read the schema back.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, OmegaConfBaseException

from rollout.config.checks import ConfigError, check_values
from rollout.config.policies import (
    POLICIES_PREFIX,
    BadPolicySetting,
    policy_keys,
    set_policies,
)
from rollout.config.schema import Settings

ConfigStore.instance().store(name="settings_schema", node=Settings)


def load(overrides: list[str] | None = None, *, preset_dirs: list[Path] | None = None) -> Settings:
    """Compose the config with `overrides` (`key=value` strings) into validated settings; `preset_dirs` are
    more places to find `preset=NAME` in (each holding `preset/NAME.yaml`: presets from the ledger,
    rollout.config.presets), and so are the folders in $ROLLOUT_PRESET_PATH (`:`-separated: a deployment's
    presets, mounted)."""
    mounted = [
        Path(d)
        for d in os.environ.get("ROLLOUT_PRESET_PATH", "").split(os.pathsep)
        if Path(d or "-").is_dir()
    ]
    preset_dirs = [*(preset_dirs or []), *mounted]
    search = (
        [f"hydra.searchpath=[{','.join(d.resolve().as_uri() for d in preset_dirs)}]"] if preset_dirs else []
    )
    given = overrides or []
    # Keys of the user's choosing, set after composing: Hydra adds none to a typed mapping without a `+`.
    per_policy = [o for o in given if o.startswith(POLICIES_PREFIX)]
    per_loss = [o for o in given if o.startswith(LOSS_PARAMS_PREFIX)]
    try:
        with initialize_config_module(config_module="rollout.conf", version_base="1.3"):
            composed = compose(
                config_name="config",
                overrides=[*search, *(o for o in given if o not in per_policy and o not in per_loss)],
            )
        set_policies(composed, per_policy)
        _set_loss_params(composed, per_loss)
        settings = OmegaConf.to_object(composed)
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(_explain(error)) from None
    except BadPolicySetting as error:
        raise ConfigError(str(error)) from None
    assert isinstance(settings, Settings)
    check_values(settings)
    return settings


LOSS_PARAMS_PREFIX = "trainer.loss_params."


def _set_loss_params(composed: DictConfig, overrides: list[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        parsed = parser.parse_override(override)
        with open_dict(composed.trainer.loss_params):
            OmegaConf.update(composed, parsed.key_or_group, parsed.value(), merge=False)


def as_dict(settings: Settings) -> dict[str, Any]:
    tree = OmegaConf.to_container(OmegaConf.structured(settings), enum_to_str=True)
    assert isinstance(tree, dict)
    return {str(key): value for key, value in tree.items()}


def valid_keys(path: str) -> list[str]:
    """The keys the schema allows under a dotted `path` ('' for the top level)."""
    if path.startswith(POLICIES_PREFIX):  # any policy's name: its keys are a PolicySettings'
        return policy_keys()
    schema = OmegaConf.structured(Settings)
    node = OmegaConf.select(schema, path) if path else schema
    return [str(key) for key in node] if isinstance(node, DictConfig) else []


def _explain(error: BaseException) -> str:
    """One line that names the key and what is wrong with it, from the deepest error that names a key."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for candidate in chain:
        text = str(candidate)
        key_match = re.search(r"full_key: ([\w.]+)", text)
        if key_match is None:
            continue
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        key, detail = key_match.group(1), lines[0]
        if detail.endswith("composing config:") and len(lines) > 1:  # an error inside a preset's file: say it
            return f"{detail.removesuffix(' raised while composing config:')}: {lines[1]}"
        if isinstance(candidate, ConfigAttributeError) or "not in" in detail:
            parent = key.rpartition(".")[0]
            choices = ", ".join(valid_keys(parent)) or "(none)"
            return f"unknown setting '{key}'. Valid keys{' under ' + parent if parent else ''}: {choices}"
        return f"bad value for '{key}': {detail}"
    return str(error).strip()
