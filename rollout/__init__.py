"""rollout: reinforcement learning for language-model agents.

Layers, each importing only those below it (`tests/test_layers.py` checks the contract in pyproject.toml): the
CLI (`rollout.cli`) on top, then the dashboard (`rollout.monitor`), the application layer (`rollout.control`),
the embedded stack (`rollout.stack`), workers, activities, workflows and the gateway, engines and sandboxes;
under all of them the core (contracts, harness, environment, ledger, blobs, config, run settings, serving,
rendering, evals, training), which imports none of them and no Temporal. See docs/architecture.md.
"""
