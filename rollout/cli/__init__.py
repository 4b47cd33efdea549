"""The `rollout` command line: the launcher layer, on top of everything; nothing below imports it.

One module per command group (`rollout.cli.run` is `rollout run …`), plus the launcher logic they share:
`env_check` (what `rollout env check` runs), `training_view` and `live` (a training run followed from the
ledger), `preflight` (a runner confirms it can load an environment before a run starts), `warm_start`
(`rollout sft`). Every command takes Hydra overrides as trailing arguments (`rollout up
services.temporal.ui_port=8300`). Errors print one paragraph that says what to do next and exit non-zero: 2
for a configuration error, 1 for anything else. Commands that scripts read have `--json`.
"""

from rollout.cli.app import app, main

__all__ = ["app", "main"]
