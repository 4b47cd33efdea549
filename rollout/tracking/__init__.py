"""A run's metrics where researchers look: one record per step from the ledger, fed to W&B and MLflow once,
and its traces to an OpenTelemetry collector.

The hub names its spokes:
- `step_metrics`: `StepMetrics`, one typed record per step of a policy, built from the ledger alone (also what
  `rollout run status --json` and `rollout run export` show).
- `entries`: the run's step, eval and sample-table records as `Entry`s of named streams, in ledger order.
- `spans` and `traces`: each episode's and step's OpenTelemetry spans, built from the ledger with ids derived
  from their names, as entries of the trace streams.
- `sinks`: the `Sink` protocol a backend implements; `wandb_sink`, `mlflow_sink` and `otlp_sink` (traces,
  to an OpenTelemetry collector) implement it, and `wandb_files` reads back W&B's local logs.
- `feed`: `Feed`, which brings each backend up to the entries, each once, retrying a refusing one with a
  bound. The runner's `feed_tracking` activity (rollout.activities.tracking) drives it for each run.
"""
