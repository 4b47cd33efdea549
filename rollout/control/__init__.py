"""The application layer: what `rollout` does, as a Python API that raises `ControlError` and prints nothing.

The faces (the CLI in rollout.cli, the dashboard in rollout.monitor) parse or draw, call one of these, and
show what it answers: they import neither the ledger, the workflows nor the activities (an import-linter
contract).
The gateway's operator routes change runs through `runs.update_run`, the one run control; tests call these
too. Its spokes: `runs` (start, list, update, reattach), `training` (check settings, ready the stack, start a
run that trains), `following` (a training run followed live), `progress` (a training run read from the
ledger), `reads` (the ledger's read API for the faces), `workflow_reads` (what Temporal says of runs'
workflows and its workers), `ledger` (a stream's events, the schema's migration), `workers` (the runner and
trainer worker processes), `evals` and `eval_schedules` (suites scored on checkpoints), `env_check` (`rollout
env check`), `warm_start` (`rollout sft`), `preflight` (a runner loads the environment before a run starts),
`tracking` (a run's tracking feed), `export`, `policy_models`, `connections` (Temporal, the ledger, the blob
store, models), `waits` and `errors`.
"""

from rollout.control.errors import ControlError, NotFound, Unreachable

__all__ = ["ControlError", "NotFound", "Unreachable"]
