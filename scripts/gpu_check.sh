#!/usr/bin/env bash
# The GPU acceptance run (scripts/gpu_check.py says what it checks): one JSON line last, exit 1 when a check
# failed. Uses the project's environment when uv and .venv are there (`uv sync --all-extras` brings vLLM), else
# the python3 on PATH (a machine with torch, transformers and peft, the repository carried to it).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v uv >/dev/null 2>&1 && [ -d .venv ]; then
  exec uv run --no-sync python scripts/gpu_check.py "$@"
fi
exec python3 scripts/gpu_check.py "$@"
