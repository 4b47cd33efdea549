"""Training math: advantages, losses and their diagnostics. Pure functions, no I/O (see docs/rl-math.md)."""
