"""rollout: reinforcement learning for language-model agents.

Layers, each importing only those below it (`tests/test_layers.py` checks the contract in pyproject.toml): the
CLI (`rollout.cli`) on top, then the dashboard (`rollout.monitor`), the application layer (`rollout.control`),
the embedded stack (`rollout.stack`), workers, activities, workflows and the gateway, engines and sandboxes;
under all of them the core (contracts, harness, environment, ledger, blobs, config, run settings, serving,
rendering, evals, training), which imports none of them and no Temporal. See docs/architecture.md.

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
