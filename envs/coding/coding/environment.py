"""The coding environment: small repository tasks (fix a failing function, add a missing case, implement what
a class lacks) in a `shell` sandbox, graded by hidden tests with partial credit.

Contract:
- `environment` is played by the built-in loop with the `shell` tool. `start` lays the task's repository out
  in the episode's sandbox (its working directory); every tool call runs there. A reply without a tool call
  hands the repository in; so does the last turn (`MAX_TURNS`), so work done is graded, never lost to the turn
  limit. The reward is the fraction of the task's hidden tests that pass (`coding.grading`); metrics:
  `tests_passed`, `tests_total`, `shell_calls`, `tool_errors`, `out_of_turns`.
- A broken tool call (unknown tool, arguments that are not a JSON object with a `command` string, a
  `timeout_s` that is not a number, a command the sandbox rejects) is answered with a tool message starting
  `error:`; the episode goes on.
- Command agents (`claude_code()`, `codex()`, `command_agent(...)`): the runner starts the command in a fresh
  working directory on the runner's machine (in a jail of its own), while the repository lives in the sandbox,
  which may be on another machine. So `start` lays the repository out in the sandbox as above, `prepare`
  copies it out of the sandbox into `{workdir}/repo` and sets the CLI up there (`coding.agents`: the command
  itself never reaches the sandbox), and `finish` grades the files the command left in `{workdir}/repo` (no
  links, no caches). Each command agent's repository is its sandbox seat's own folder
  (`coding.agents.seat_folder`), so `claude_code_and_codex()` seats both CLIs on one task in one sandbox, each
  graded on its own copy.
- Grading (`coding.grading`) runs the agent's code on a copy of its files in a grader's jail on the runner's
  machine, after the agent's processes are gone, under the runner's `sandbox.isolation`; the hidden tests and
  reference solutions (`coding/grader/`) never enter a sandbox or a jail.
- The dataset ships in the package (`coding.tasks`); the last `HELD_OUT` tasks are `eval_source`.
- Not replayable: the repository lives in the sandbox, outside the Task.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from coding.agents import FLAVOURS, prepare_command, repository_of, seat_folder
from coding.grading import SKIPPED_FOLDERS, Grade, grade, grade_files, lay_out, read_back
from coding.solver import solve
from coding.tasks import CodingTask, held_out_tasks, rows, task_named, training_tasks
from rollout.contracts import Message, ToolCall
from rollout.environment import AgentSeatSpec, Dataset, Environment, SandboxSpec
from rollout.harness import (
    BadToolCall,
    CommandOutcome,
    CommandSetup,
    End,
    Observation,
    RunContext,
    SandboxSeat,
    Task,
    finite_number,
    tool_arguments,
)
from rollout.sandbox import SandboxClient
from rollout.sandbox.client import SandboxActionError
from rollout.sandbox.shell import MAX_TIMEOUT_S, SHELL_TOOL, shell_result_text

MIN_TIMEOUT_S = 0.1  # a command's own time limit, when the agent gives one

MAX_TURNS = 20
MAX_FILE_BYTES = 1024 * 1024  # a command agent's files bigger than this are not handed in


def _seat(run: RunContext) -> SandboxSeat:
    if run.sandbox is None:
        raise RuntimeError("a coding task needs a shell sandbox seat: its environment declares one")
    return run.sandbox


def _file_list(task: CodingTask) -> str:
    return ", ".join(sorted(task.files))


def _metrics(graded: Grade) -> dict[str, float]:
    return {"tests_passed": float(len(graded.passed)), "tests_total": float(len(graded.tests))}


class ShellCoding(Task):
    """The built-in loop: the model drives the sandbox's shell, then hands the repository in."""

    def __init__(self, task: CodingTask, max_turns: int = MAX_TURNS) -> None:
        self.task = task
        self.max_turns = max_turns
        self.turns = self.shell_calls = self.tool_errors = 0

    async def start(self, run: RunContext) -> Observation:
        async with SandboxClient(_seat(run)) as box:
            await lay_out(box, dict(self.task.files), clear=True)
        text = (
            f"{self.task.instruction}\n\nThe repository is the working directory of your shell tool; its files: "
            f"{_file_list(self.task)}. Use the shell tool to read, edit and run code (`python3 -m unittest` runs "
            "the visible tests in tests.py). When you are done, reply without a tool call: hidden tests then "
            "grade the repository, with credit for each test that passes."
        )
        return Observation(text, tools=(SHELL_TOOL,))

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        self.turns += 1
        if not reply.tool_calls:
            return await self._hand_in(run, ())
        async with SandboxClient(_seat(run)) as box:
            results = tuple(
                [
                    Message(role="tool", text=await self._tool_result(box, call), tool_call_id=call.id)
                    for call in reply.tool_calls
                ]
            )
        if self.turns >= self.max_turns:
            return await self._hand_in(run, results, out_of_turns=True)
        return Observation(results)

    async def _tool_result(self, box: SandboxClient, call: ToolCall) -> str:
        if call.name != SHELL_TOOL.name:
            self.tool_errors += 1
            return f"error: there is no tool {call.name!r}; the only tool is {SHELL_TOOL.name!r}"
        try:
            arguments = tool_arguments(call)
            command = arguments.get("command")
            if not isinstance(command, str) or not command.strip():
                raise BadToolCall('the arguments need a non-empty "command" string, e.g. {"command": "ls"}')
            action: dict[str, object] = {"command": command}
            if arguments.get("timeout_s") is not None:
                action["timeout_s"] = finite_number(
                    arguments["timeout_s"], "timeout_s", low=MIN_TIMEOUT_S, high=MAX_TIMEOUT_S
                )
        except BadToolCall as error:
            self.tool_errors += 1
            return f'error: {error}; send {{"command": "..."}}'
        self.shell_calls += 1
        try:
            return shell_result_text(await box.act(action))
        except SandboxActionError as error:
            self.tool_errors += 1
            return f"error: {error}"

    async def _hand_in(
        self, run: RunContext, last: tuple[Message, ...], *, out_of_turns: bool = False
    ) -> End:
        async with SandboxClient(_seat(run)) as box:
            graded = await grade(box, self.task, isolation=run.isolation)
        metrics = _metrics(graded) | {
            "shell_calls": float(self.shell_calls),
            "tool_errors": float(self.tool_errors),
            "out_of_turns": float(out_of_turns),
        }
        summary = Message.user(graded.summary())
        return End((*last, summary), reward=graded.reward, metrics=metrics)


def handed_in_files(repository: Path) -> dict[str, bytes]:
    """The files a command agent left in its repository folder: no caches, no links, none over
    MAX_FILE_BYTES."""
    files: dict[str, bytes] = {}
    for path in sorted(repository.rglob("*")):
        relative = path.relative_to(repository)
        if set(relative.parts) & SKIPPED_FOLDERS or path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size <= MAX_FILE_BYTES:
            files[relative.as_posix()] = path.read_bytes()
    return files


class CommandCoding(Task):
    """A command agent (Claude Code, Codex, a script) works on a copy of the repository in its working
    directory; `finish` grades that copy in the sandbox. `flavour` says how the command is set up
    (`coding.agents`: plain, claude-code or codex)."""

    def __init__(self, task: CodingTask, flavour: str = "plain") -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {FLAVOURS}, not {flavour!r}")
        self.task = task
        self.flavour = flavour

    async def start(self, run: RunContext) -> Observation:
        seat = _seat(run)
        async with SandboxClient(seat) as box:
            await lay_out(box, dict(self.task.files), clear=True, folder=seat_folder(seat.seat))
        return Observation(
            f"{self.task.instruction}\n\nThe repository is your current working directory; its files: "
            f"{_file_list(self.task)}. Edit its files in place (`python3 -m unittest` runs the visible tests in "
            "tests.py). When you stop, hidden tests grade the repository, with credit for each test that passes."
        )

    async def prepare(self, run: RunContext, setup: CommandSetup) -> None:
        seat = _seat(run)
        async with SandboxClient(seat) as box:
            files = await read_back(box, folder=seat_folder(seat.seat))
        prepare_command(self.flavour, setup, files)

    async def finish(self, run: RunContext, outcome: CommandOutcome) -> End:
        repository = repository_of(Path(outcome.workdir))
        metrics = {"turns": float(outcome.turns), "timed_out": float(outcome.timed_out)}
        # The folder is the agent's: a link put in its place would have this process read whatever it points
        # to.
        if repository.is_symlink() or not repository.is_dir():
            why = f"the command removed its {repository.name}/ folder\n{outcome.output[-2000:]}"
            return End(why, reward=0.0, metrics=metrics | {"tests_passed": 0.0})
        graded = await grade_files(handed_in_files(repository), self.task, run.isolation)
        return End(graded.summary(), reward=graded.reward, metrics=metrics | _metrics(graded))


environment = Environment(
    name="coding",
    make_task=lambda parameters, agent: ShellCoding(task_named(parameters["task"])),
    source=Dataset(rows(training_tasks())),
    eval_source=Dataset(rows(held_out_tasks())),
    group_size=4,
    max_turns=MAX_TURNS,
    sandbox=SandboxSpec("shell"),
    replayable=False,  # the repository lives in the sandbox, outside the Task
    description="Fix or extend a small Python repository with a shell tool; reward: the share of hidden tests passed.",
    scripted_reply=solve,
)


def command_agent(
    flavour: str, command: Sequence[str], *, name: str = "coding-command", timeout_s: float = 1800.0
) -> Environment:
    """The coding environment played by `command` (its arguments may say `{prompt}` and `{workdir}`), started
    in the task's repository and set up as `flavour` says (`plain`, `claude-code` or `codex`:
    coding.agents)."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, not {flavour!r}")
    return replace(
        environment,
        name=name,
        make_task=lambda parameters, agent: CommandCoding(task_named(parameters["task"]), flavour),
        agents=(AgentSeatSpec("solver", command=tuple(command), timeout_s=timeout_s),),
        scripted_reply=None,
    )


def _claude_command(executable: str | None) -> tuple[str, ...]:
    claude = executable or os.environ.get("CODING_CLAUDE", "claude")
    tools = "Bash,Read,Edit,Write,Glob,Grep"
    # `--tools` offers the model only these (every tool's schema is prompt tokens); `--allowedTools` runs them
    # without asking.
    return (claude, "-p", "{prompt}", "--tools", tools, "--allowedTools", tools)


def _codex_command(executable: str | None) -> tuple[str, ...]:
    binary = executable or os.environ.get("CODING_CODEX", "codex")
    return (binary, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "{prompt}")


def claude_code(executable: str | None = None, *, timeout_s: float = 1800.0) -> Environment:
    """Claude Code (`claude -p`) plays: `executable`, else `$CODING_CLAUDE`, else `claude` on the PATH."""
    return command_agent(
        "claude-code", _claude_command(executable), name="coding-claude-code", timeout_s=timeout_s
    )


def codex(executable: str | None = None, *, timeout_s: float = 1800.0) -> Environment:
    """Codex (`codex exec`) plays: `executable`, else `$CODING_CODEX`, else `codex` on the PATH."""
    return command_agent("codex", _codex_command(executable), name="coding-codex", timeout_s=timeout_s)


def claude_code_and_codex(
    claude: str | None = None, codex_executable: str | None = None, *, timeout_s: float = 1800.0
) -> Environment:
    """Claude Code and Codex on the same task at once, two seats of one episode training one policy: each
    works on its own copy of the repository (its sandbox seat's folder) and is graded on its own. The
    executables are found as `claude_code` and `codex` find theirs."""

    # Each seat is named after its flavour.
    return replace(
        environment,
        name="coding-claude-code-and-codex",
        make_task=lambda parameters, agent: CommandCoding(task_named(parameters["task"]), agent),
        agents=(
            AgentSeatSpec("claude-code", command=_claude_command(claude), timeout_s=timeout_s),
            AgentSeatSpec("codex", command=_codex_command(codex_executable), timeout_s=timeout_s),
        ),
        sandbox=SandboxSpec("shell", seats=2),
        scripted_reply=None,
    )
