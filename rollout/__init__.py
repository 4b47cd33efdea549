"""rollout: reinforcement learning for language-model agents.

The core (contracts, harness, ledger, blobs, config, environment, serving, rendering, training math) sits at
the bottom; the gateway, engines and sandboxes on it; workflows and activities above them; workers above
those; the launcher layer (`rollout.cli`, `rollout.stack`) on top. `tests/test_layers.py` keeps it so; see
docs/architecture.md.
"""
