"""The RL math, pure functions with no I/O: a step's batch from recorded episodes (segments, group
advantages, which groups are ready) and the off-policy losses (rollout.training's trainers apply them;
docs/rl-math.md)."""
