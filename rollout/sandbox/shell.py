"""The `shell` sandbox kind: a computer, i.e. a working directory and a process runner that agents drive.

Contract:
- Every seat shares one working directory, the jail's workspace (rollout.sandbox.jail: the only place a command
  may write, at `/sandbox` inside; a tmpfs of `limits.disk_bytes` when run by root). `reset()` kills every command
  still running (and all they started) and empties it: a claim starts from a clean directory, alone.
- `act(seat, {"command": str, "timeout_s"?: float})` runs the command with `bash -c` in its own jail and
  answers `{"exit_code", "output", "truncated", "timed_out"}`. stdout and stderr are merged in order. A command
  killed by `reset()` (its claim was superseded) raises `CommandKilled`.
- Limits: a command runs at most `timeout_s` (default `DEFAULT_TIMEOUT_S`, capped at `MAX_TIMEOUT_S`); then its
  whole tree is killed, `timed_out` is true and `exit_code` is null. Output beyond `MAX_OUTPUT_BYTES` is dropped
  (the command keeps running to its end) and `truncated` is true. What it may use is `limits` (`SHELL_LIMITS`).
- `SHELL_TOOL` is the tool an agent drives it with; `shell_result_text` renders a result for the model.
"""

from __future__ import annotations

from pathlib import Path

from rollout.contracts import ToolSpec
from rollout.sandbox.jail import Isolation, Jail, jail_uid
from rollout.sandbox.limits import SHELL_LIMITS, JailLimits
from rollout.sandbox.workspace import Workspace
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
    runs_agent_commands = True

    def __init__(
        self,
        workdir: Path,
        seats: int,
        *,
        isolation: Isolation = Isolation.bwrap,
        limits: JailLimits = SHELL_LIMITS,
    ) -> None:
        self.seats = seats
        self.workspace = Workspace(workdir, disk_bytes=limits.disk_bytes, owner=jail_uid())
        self.jail = Jail(self.workspace, limits=limits, isolation=isolation)

    @property
    def workdir(self) -> Path:
        return self.workspace.path

    async def reset(self) -> None:
        await self.jail.kill_all()
        self.workspace.clear()

    async def act(self, seat: int, action: JsonObject) -> JsonObject:
        command = action.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ValueError("a shell action needs a non-empty 'command' string")
        timeout = action.get("timeout_s")
        if timeout is not None and (
            not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0
        ):
            raise ValueError(f"'timeout_s' must be a positive number of seconds (at most {MAX_TIMEOUT_S:g})")
        timeout_s = min(float(timeout or DEFAULT_TIMEOUT_S), MAX_TIMEOUT_S)
        done = await self.jail.run(
            ["bash", "-c", command],
            timeout_s=timeout_s,
            max_output_bytes=MAX_OUTPUT_BYTES,
            env={"ROLLOUT_SANDBOX_SEAT": str(seat)},
        )
        return {
            "exit_code": done.exit_code,
            "output": done.output,
            "truncated": done.truncated,
            "timed_out": done.timed_out,
        }

    async def close(self) -> None:
        await self.jail.close()
        self.workspace.close()
