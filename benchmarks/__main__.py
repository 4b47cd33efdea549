"""Run one benchmark by name: `uv run python -m benchmarks ledger`."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS = {
    "ledger": "benchmarks.ledger",
    "gateway": "benchmarks.gateway",
    "episodes": "benchmarks.episodes",
    "async": "benchmarks.asynchrony",
    "learning": "benchmarks.learning",
    "chaos": "benchmarks.chaos",
    "monitor": "benchmarks.monitor",
    "minecraft": "benchmarks.minecraft",
    "gpu": "benchmarks.gpu",
    "race": "benchmarks.race",
    "stability": "benchmarks.stability",
    "sandbox": "benchmarks.sandbox",
    "startup": "benchmarks.startup",
    "quickstart": "benchmarks.quickstart",
    "multipolicy": "benchmarks.multipolicy",
    "temporal": "benchmarks.temporal_load",
    "multiturn": "benchmarks.multiturn",
    "treetrain": "benchmarks.treetrain",
    "tracking": "benchmarks.tracking",
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark to run")
    parser.add_argument("--quick", action="store_true", help="a smaller run, to check that it works")
    args = parser.parse_args()
    module = importlib.import_module(BENCHMARKS[args.name])
    return module.main(quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
