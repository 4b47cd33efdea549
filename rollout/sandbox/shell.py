"""The `shell` sandbox kind: a computer, i.e. a working directory and a process runner that agents drive.

Contract:
- Every seat shares one working directory; `reset()` empties it (a claim starts from a clean directory).
- `act(seat, {"command": str, "timeout_s"?: float})` runs the command with `bash -c` in that directory and
  answers `{"exit_code", "output", "truncated", "timed_out"}`. stdout and stderr are merged in order.
- Limits (rollout.bounded_process): a command runs at most `timeout_s` (default `DEFAULT_TIMEOUT_S`, capped at
  `MAX_TIMEOUT_S`); then its whole process group is killed, `timed_out` is true and `exit_code` is null. Output
  beyond `MAX_OUTPUT_BYTES` is dropped (the command keeps running to its end) and `truncated` is true.
- `SHELL_TOOL` is the tool an agent drives it with; `shell_result_text` renders a result for the model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rollout.bounded_process import run_bounded
from rollout.contracts import ToolSpec
from rollout.sandbox.world import JsonObject

DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 120.0
MAX_OUTPUT_BYTES = 16 * 1024

SHELL_TOOL = ToolSpec(
    name="shell",
    description="Run a bash command in the sandbox's working directory; answers its exit code and output.",
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "the bash command line"},
            "timeout_s": {
                "type": "number",
                "description": f"seconds before it is killed (≤ {MAX_TIMEOUT_S:g})",
            },
        },
        "required": ["command"],
    },
)


def shell_result_text(result: JsonObject) -> str:
    notes = []
    if result.get("timed_out"):
        notes.append("[killed: time limit]")
    if result.get("truncated"):
        notes.append("[output truncated]")
    return f"exit code {result['exit_code']}\n{result['output']}{' '.join(notes)}"


class ShellWorld:
    def __init__(self, workdir: Path, seats: int) -> None:
        self.workdir = workdir
        self.seats = seats
        workdir.mkdir(parents=True, exist_ok=True)

    async def reset(self) -> None:
        for entry in self.workdir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    async def act(self, seat: int, action: JsonObject) -> JsonObject:
        command = action.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ValueError("a shell action needs a non-empty 'command' string")
        timeout_s = min(float(action.get("timeout_s") or DEFAULT_TIMEOUT_S), MAX_TIMEOUT_S)
        done = await run_bounded(
            ["bash", "-c", command],
            cwd=self.workdir,
            timeout_s=timeout_s,
            max_output_bytes=MAX_OUTPUT_BYTES,
            env={"HOME": str(self.workdir), "ROLLOUT_SANDBOX_SEAT": str(seat)},
        )
        return {
            "exit_code": done.exit_code,
            "output": done.output,
            "truncated": done.truncated,
            "timed_out": done.timed_out,
        }

    async def close(self) -> None:
        return None
