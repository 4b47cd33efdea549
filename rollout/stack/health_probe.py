"""`rollout-health`: a container's health check, for the images' HEALTHCHECK and the chart's exec probes.

Contract: with `ROLLOUT_HEALTH_URL` set, exit 0 when a GET of it answers 2xx within `ROLLOUT_HEALTH_TIMEOUT_S`
(default 4 s), else 1 with the reason on stderr; without it (a role with no port: runner, trainer), exit 0
(the process running is its health). It imports nothing heavy: it runs every 30 s.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> None:
    url = os.environ.get("ROLLOUT_HEALTH_URL", "")
    if not url:
        sys.exit(0)
    timeout_s = float(os.environ.get("ROLLOUT_HEALTH_TIMEOUT_S", "4"))
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status = response.status
    except (urllib.error.URLError, OSError) as error:
        print(f"unhealthy: {url}: {error}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0 if 200 <= status < 300 else 1)


if __name__ == "__main__":
    main()
