"""A run's metrics where researchers look: one record per step from the ledger, fed to W&B and MLflow once.

The hub names its spokes:
- `step_metrics`: `StepMetrics`, one typed record per step of a policy, built from the ledger alone (also what
  `rollout run status --json` and `rollout run export` show).
- `entries`: the run's step, eval and sample-table records as `Entry`s of named streams, in ledger order.
- `sinks`: the `Sink` protocol a backend implements; `wandb_sink` and `mlflow_sink` implement it, and
  `wandb_files` reads back W&B's local logs.
- `feed`: `Feed`, which brings each backend up to the entries, each once, retrying a refusing one with a
  bound. The runner's `feed_tracking` activity (rollout.activities.tracking) drives it for each run.
"""
