"""Benchmarks: `uv run python -m benchmarks NAME`. Each compares against a baseline in the same run and
prints one JSON line last; results are recorded in benchmarks/RESULTS.md."""
