"""The trainers and their files: torch + peft in one process (`local`) or data-parallel on Ray workers, SFT
warm starts, Tinker's data, checkpoints published to the blob store and the ledger, and their bridges."""
