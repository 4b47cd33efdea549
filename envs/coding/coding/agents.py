"""How a command agent (Claude Code, Codex, a script) is set up for a coding task: what
`CommandCoding.prepare` does in the command's working directory before the command starts.

The runner starts a seat's command in a fresh, empty working directory (in its jail); the task's repository is
in the episode's `shell` sandbox, where the Task's `start` laid it out in the seat's own folder
(`seat_folder`). `prepare_command(flavour, setup, files)`:
1. writes the repository's `files` (copied out of the sandbox by the Task: the command never reaches the
   sandbox) into `{workdir}/repo`, where the command starts and which `finish` grades;
2. uses the home the runner made, `{workdir}/home` (the agent's configuration and caches, never graded);
3. per FLAVOUR: `claude-code` turns off Claude Code's non-essential traffic and auto-updater (it reaches its
   seat through `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY`); `codex` writes `$CODEX_HOME/config.toml` with a
   provider `rollout` at the seat's `OPENAI_BASE_URL` (the Responses API, the key from `ROLLOUT_API_KEY`);
   `plain` adds nothing.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from rollout.harness import CommandSetup

FLAVOURS = ("plain", "claude-code", "codex")
REPOSITORY = "repo"


def seat_folder(seat: int) -> str:
    """Where, in the sandbox, the repository of the command agent on sandbox seat `seat` lives: each seat has
    its own copy, so agents sharing one sandbox (Claude Code beside Codex) never edit each other's."""
    return f"seat{seat}"


def codex_config(base_url: str) -> str:
    # json.dumps writes a string TOML reads the same way (a basic string).
    return (
        'model = "rollout-policy"\nmodel_provider = "rollout"\n\n[model_providers.rollout]\nname = "rollout"\n'
        f'base_url = {json.dumps(base_url)}\nwire_api = "responses"\nenv_key = "ROLLOUT_API_KEY"\n'
    )


def prepare_command(flavour: str, setup: CommandSetup, files: dict[str, bytes]) -> None:
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, not {flavour!r}")
    repository = setup.workdir / REPOSITORY
    for name, data in files.items():
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts:
            continue  # read_back keeps none such; a guard all the same
        path = repository / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    repository.mkdir(exist_ok=True)
    setup.cwd = REPOSITORY
    home = setup.workdir / "home"
    home.mkdir(exist_ok=True)
    if flavour == "claude-code":
        setup.environment |= {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    elif flavour == "codex":
        codex_home = home / ".codex"
        codex_home.mkdir(exist_ok=True)
        variables = setup.environment
        base_url = variables.get("OPENAI_BASE_URL") or variables.get("ROLLOUT_BASE_URL", "")
        (codex_home / "config.toml").write_text(codex_config(base_url))
        setup.environment["CODEX_HOME"] = f"{setup.inside}/home/.codex"


def repository_of(workdir: Path) -> Path:
    return workdir / REPOSITORY
