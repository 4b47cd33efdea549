"""rollout.gateway: see docs/architecture.md for its place in the design."""
