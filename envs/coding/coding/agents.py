"""`python -m coding.agents FLAVOUR WORKDIR -- COMMAND...`: how a command agent reaches a coding task.

The runner starts a seat's command in a fresh, empty WORKDIR on its own machine; the task's repository is in
the episode's `shell` sandbox, where the Task's `start` laid it out. This wrapper, the seat's command:
1. copies the repository out of the sandbox (`ROLLOUT_SANDBOX_URL`, `ROLLOUT_SANDBOX_EPOCH`,
   `ROLLOUT_SANDBOX_SEAT`, set by the runner; the seat's own folder, `seat_folder`) into WORKDIR/repo, which the Task's `finish` grades;
2. gives the agent a home of its own, WORKDIR/home (its configuration and caches, never graded);
3. per FLAVOUR: `claude-code` turns off Claude Code's non-essential traffic and auto-updater (it reaches its
   seat through the runner's `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY`); `codex` writes
   `$CODEX_HOME/config.toml` with a provider `rollout` at the seat's `OPENAI_BASE_URL` (the Responses API,
   the key from `ROLLOUT_API_KEY`); `plain` adds nothing;
4. replaces itself with COMMAND, run in WORKDIR/repo.
It exits with status 3, saying why, when the repository cannot be copied out.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from coding.grading import read_back
from rollout.harness import SandboxSeat
from rollout.sandbox import SandboxClient

FLAVOURS = ("plain", "claude-code", "codex")
USAGE = "usage: python -m coding.agents {plain|claude-code|codex} WORKDIR -- COMMAND..."


def sandbox_seat(variables: dict[str, str]) -> SandboxSeat:
    try:
        return SandboxSeat(
            address=variables["ROLLOUT_SANDBOX_URL"],
            kind="shell",
            name="",
            epoch=int(variables["ROLLOUT_SANDBOX_EPOCH"]),
            seat=int(variables["ROLLOUT_SANDBOX_SEAT"]),
        )
    except (KeyError, ValueError) as error:
        raise SystemExit(f"coding.agents: no sandbox seat in the environment ({error}): {USAGE}") from None


def seat_folder(seat: int) -> str:
    """Where, in the sandbox, the repository of the command agent on sandbox seat `seat` lives: each seat has its
    own copy, so agents sharing one sandbox (Claude Code beside Codex) never edit each other's."""
    return f"seat{seat}"


async def copy_out(seat: SandboxSeat, repository: Path) -> int:
    async with SandboxClient(seat) as box:
        files = await read_back(box, folder=seat_folder(seat.seat))
    for name, data in files.items():
        path = repository / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return len(files)


def codex_config(base_url: str) -> str:
    # json.dumps writes a string TOML reads the same way (a basic string).
    return (
        'model = "rollout-policy"\nmodel_provider = "rollout"\n\n[model_providers.rollout]\nname = "rollout"\n'
        f'base_url = {json.dumps(base_url)}\nwire_api = "responses"\nenv_key = "ROLLOUT_API_KEY"\n'
    )


def prepared_environment(flavour: str, workdir: Path, variables: dict[str, str]) -> dict[str, str]:
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    prepared = dict(variables) | {"HOME": str(home)}
    if flavour == "claude-code":
        prepared |= {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    elif flavour == "codex":
        codex_home = home / ".codex"
        codex_home.mkdir(exist_ok=True)
        base_url = variables.get("OPENAI_BASE_URL") or variables.get("ROLLOUT_BASE_URL", "")
        (codex_home / "config.toml").write_text(codex_config(base_url))
        prepared["CODEX_HOME"] = str(codex_home)
    return prepared


def main(arguments: list[str]) -> None:
    if len(arguments) < 4 or arguments[0] not in FLAVOURS or arguments[2] != "--":
        raise SystemExit(USAGE)
    flavour, workdir, command = arguments[0], Path(arguments[1]), arguments[3:]
    repository = workdir / "repo"
    repository.mkdir(parents=True, exist_ok=True)
    variables = dict(os.environ)
    try:
        copied = asyncio.run(copy_out(sandbox_seat(variables), repository))
    except Exception as error:  # any failure to reach the sandbox: say why, exit 3
        print(
            f"coding.agents: the repository could not be copied out of the sandbox: {error}", file=sys.stderr
        )
        raise SystemExit(3) from None
    print(
        f"coding.agents: {copied} files in {repository}; starting {command[0]}", file=sys.stderr, flush=True
    )
    os.chdir(repository)
    os.execvpe(command[0], command, prepared_environment(flavour, workdir, variables))


if __name__ == "__main__":
    main(sys.argv[1:])
