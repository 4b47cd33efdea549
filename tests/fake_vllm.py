"""A named fake of `vllm serve` for machines without a GPU: it serves the local engine over the same HTTP API.

`rollout engine serve --kind vllm` runs whatever `vllm` is first on PATH; tests put a wrapper around this
module there. It takes the arguments rollout's launcher passes (model, host, port, served name; the rest,
which shape a real vLLM's memory and LoRA slots, are ignored) and replaces itself with `rollout engine serve
--kind local --no-follow`, so the follower under test is the one `engine serve --kind vllm` runs. As vLLM
would, it takes its API key from `VLLM_API_KEY`: it refuses to start without one, or with one on its command
line, or with one that is not the data directory's engine API key (the key the server it execs demands). The
live counterpart is the `gpu`-marked test in tests/test_gpu.py, against a real vLLM.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    assert argv[0] == "serve", f"the fake vllm only serves, not {argv[0]!r}"
    key = os.environ.get("VLLM_API_KEY")
    assert key, "vllm serve was started without VLLM_API_KEY: anyone could drive it"
    assert "--api-key" not in argv and not any(key in a for a in argv), "the key is on the command line"
    if data_dir := os.environ.get("ROLLOUT_DATA_DIR"):
        from pathlib import Path

        from rollout.serving.keys import load_engine_api_key

        assert key == load_engine_api_key(Path(data_dir)), "VLLM_API_KEY is not the engine API key"
    model = argv[1]
    options = dict(zip(argv[2::2], argv[3::2], strict=False))
    command = [
        sys.executable,
        "-m",
        "rollout.cli",
        "engine",
        "serve",
        "--kind",
        "local",
        "--no-follow",
        "--device",
        "cpu",
        "--model",
        model,
        "--host",
        options.get("--host", "127.0.0.1"),
        "--port",
        options.get("--port", "8000"),
        "--served-name",
        options.get("--served-model-name", "base"),
    ]
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main(sys.argv[1:])
