"""rollout: reinforcement learning for language-model agents.

Layers, each importing only those below it (`tests/test_layers.py` checks the contract in pyproject.toml): the
CLI (`rollout.cli`) on top, then the dashboard (`rollout.monitor`), the application layer (`rollout.control`),
the embedded stack (`rollout.stack`), workers, activities, workflows and the gateway, engines and sandboxes;
under all of them the core, which imports none of them and no Temporal: the author API (`contracts`,
`harness`, `environment`, `task_sources`, `references`), `blobs`, and the packages `ledger`, `records`, `run`
(a run's settings, launch, pins and failures), `config`, `serving`, `security` (the guards at the edges),
`rl`, `rendering`, `evals` and `training`. See docs/architecture.md.

The author API, what an environment's author imports, is the `__all__` of the modules in `AUTHOR_API`; every
other module is internal.
"""

# The modules an environment's (or a suite's) author imports: their `__all__` is rollout's public API, kept
# stable across releases; every other module is internal to rollout and may change. docs/reference.md lists
# these first.
AUTHOR_API = (
    "rollout.environment",
    "rollout.harness",
    "rollout.contracts",
    "rollout.sandbox.client",
    "rollout.evals",
)
