"""The application layer: what `rollout` does, as a Python API that raises `ControlError` and prints nothing.

The CLI (rollout.cli) parses, calls one of these, and prints; tests call them too, and the dashboard's buttons
and the gateway's operator routes change runs through `runs.update_run`, the one run control. Its spokes:
`runs` (start, list, update, reattach), `training` (check settings, ready the stack, start a run that trains),
`progress` (a training run read from the ledger), `evals` and `eval_schedules` (suites scored on
checkpoints), `env_check` (`rollout env check`), `warm_start` (`rollout sft`), `preflight` (a runner loads the
environment before a run starts), `connections` (Temporal, the ledger, the blob store, models) and `errors`.
"""

from rollout.control.errors import ControlError, NotFound, Unreachable

__all__ = ["ControlError", "NotFound", "Unreachable"]
