"""rollout's Hydra config tree: `config.yaml` and its groups (presets come here as groups)."""
