"""Training: the RL math (advantages, losses, batch selection; pure functions, see docs/rl-math.md) and the
trainers and checkpoint files that apply it (`local`, `data_parallel`, `sft`, `checkpoints`, `bridges`:
models, files and the ledger's payloads)."""
