"""Temporal workflows: a run, its supply of episode groups, episodes and their seats, training, bridges and
evals. Deterministic code only: inputs and results cross the boundary as typed records or stubs."""
