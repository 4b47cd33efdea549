"""The `rollout` command line: the top layer; it parses, calls rollout.control (or a service's entry point),
and prints. Nothing below imports it.

One module per command group (`rollout.cli.run` is `rollout run …`), plus `live` (a training run followed on
the terminal) and `common` (consoles, settings from overrides, the one-paragraph error). Every command takes
Hydra overrides as trailing arguments (`rollout up services.temporal.ui_port=8300`). Errors print one
paragraph that says what to do next and exit non-zero: 2 for a configuration error or a wrong request, 1 for
anything else. Commands that scripts read have `--json`.
"""

from rollout.cli.app import app, main

__all__ = ["app", "main"]
