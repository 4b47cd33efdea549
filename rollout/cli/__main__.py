"""`python -m rollout.cli`: how the embedded stack starts its own processes."""

import sys

from rollout.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
