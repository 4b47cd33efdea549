"""Temporal workflows: a run, its supply of episode groups, episodes and their seats, training, bridges and
evals. Deterministic code only: inputs and results cross the boundary as typed records or stubs. Each
workflow's records are in a module beside it (`run_types`, `episode_types`, `training_types`, `eval_types`),
which its activity stubs (`runner_stubs`, `trainer_stubs`) import too."""
