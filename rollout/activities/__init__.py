"""Temporal activities: the side effects workflows ask for (playing an agent's seat, assembling a batch, a
training step, a bridge, an eval's scoring), each idempotent against the ledger so a retry changes nothing."""
