"""A named fake of `vllm serve` for machines without a GPU: it serves the local engine over the same HTTP API.

`rollout engine serve --kind vllm` runs whatever `vllm` is first on PATH; tests put a wrapper around this
module there. It takes the arguments rollout's launcher passes (model, host, port, served name; the rest,
which shape a real vLLM's memory and LoRA slots, are ignored) and replaces itself with `rollout engine serve
--kind local --no-follow`, so the follower under test is the one `engine serve --kind vllm` runs. The live
counterpart is the `gpu`-marked test in tests/test_gpu.py, against a real vLLM.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    assert argv[0] == "serve", f"the fake vllm only serves, not {argv[0]!r}"
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
