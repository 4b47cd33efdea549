"""The coding environment on a real shell sandbox server: every shipped task's reference solution scores 1 and
its unmodified repository less (with partial credit), the scripted solver through the built-in loop, broken
tool calls answered as tool errors, and command agents through `python -m coding.agents`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coding.agents import seat_folder
from coding.environment import CommandCoding, ShellCoding, command_agent, environment
from coding.grader.harness import PER_TEST_S
from coding.grader.harness import grade as grade_in_jail
from coding.grading import grade, grade_files, lay_out, read_back
from coding.solver import solve, write_files_command
from coding.tasks import HELD_OUT, coding_tasks, held_out_tasks, task_named, training_tasks
from rollout.activities.agent_loop import play
from rollout.activities.external_loop import play_external
from rollout.contracts import Message, ToolCall, ToolSpec
from rollout.control.env_check import check_environment
from rollout.harness import CommandSetup, End, Observation, RunContext, SandboxSeat
from rollout.net import serving
from rollout.sandbox import SandboxClient
from rollout.sandbox.client import SandboxRefused
from rollout.sandbox.jail import Jail
from rollout.sandbox.keys import kind_key
from rollout.sandbox.server import build_sandbox_app
from rollout.sandbox.shell import ShellWorld
from rollout.security.isolation import SandboxIsolation
from tests.red_team import FORGER
from tests.sandboxutil import SANDBOX_KEY, claimed_seat

ROLLOUT = str(Path(sys.executable).parent / "rollout")


class Sandbox:
    """A shell sandbox served over HTTP in this process; each `claim()` opens a new epoch (a clean world)."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url, self.workdir, self.epoch = url, workdir, 0

    async def claim(self) -> SandboxSeat:
        self.epoch += 1
        seat = claimed_seat(self.url, "shell", "coding-test", epoch=self.epoch, seat=0)
        async with SandboxClient(seat) as box:
            await box.open()
        return seat


@asynccontextmanager
async def served_sandbox(workdir: Path) -> AsyncIterator[Sandbox]:
    world = ShellWorld(workdir, seats=1)
    try:
        async with serving(
            build_sandbox_app(
                world, kind="shell", name="coding-test", seats=1, key=kind_key(SANDBOX_KEY, "shell")
            )
        ) as url:
            yield Sandbox(url, world.workdir)
    finally:
        await world.close()


def context(seat: SandboxSeat, episode: str = "episode-0") -> RunContext:
    return RunContext(run="coding-test", episode=episode, seat="coding-test/solver", sandbox=seat)


class Replies:
    """A model that answers with `script(messages, tools)`, recording what it was sent."""

    def __init__(self, script: Callable[[list[Message], tuple[ToolSpec, ...]], Message]) -> None:
        self.script = script
        self.sent: list[list[Message]] = []

    async def reply(self, messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
        self.sent.append(list(messages))
        return self.script(messages, tools)


def shell_call(arguments: str, name: str = "shell", call_id: str = "call") -> Message:
    return Message.assistant("", tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments),))


def test_the_dataset_ships_enough_tasks_of_every_kind_with_held_out_ones() -> None:
    tasks = coding_tasks()
    assert len(tasks) >= 20 + HELD_OUT
    assert {task.kind for task in tasks} == {"fix", "add-case", "implement"}
    assert len({task.id for task in tasks}) == len(tasks) and len({t.instruction for t in tasks}) == len(
        tasks
    )
    assert environment.source.parameters(0) == {"task": tasks[0].id, "kind": tasks[0].kind}
    assert environment.eval_source is not None
    training = {environment.source.parameters(i)["task"] for i in range(len(training_tasks()))}
    evals = {environment.eval_source.parameters(i)["task"] for i in range(HELD_OUT)}
    assert evals == {task.id for task in held_out_tasks()} and not training & evals
    for task in tasks:
        assert "hidden_tests.py" not in task.files and task.hidden_tests not in task.files.values()


async def test_reference_solutions_score_1_and_unmodified_repositories_less(tmp_path: Path) -> None:
    rewards: dict[str, float] = {}
    async with served_sandbox(tmp_path / "box") as sandbox, SandboxClient(await sandbox.claim()) as box:
        for task in coding_tasks():
            await lay_out(box, dict(task.files), clear=True)
            unmodified = await grade(box, task)
            assert unmodified.reward < 1.0, f"{task.id}: the unmodified repository already passes"
            assert unmodified.failed_tests() and unmodified.summary().count("FAILED") == len(
                unmodified.failed_tests()
            )
            await lay_out(box, dict(task.solution), clear=False)
            solved = await grade(box, task)
            assert solved.reward == 1.0, f"{task.id}: {solved.summary()}"
            left = sorted(p.relative_to(sandbox.workdir).as_posix() for p in sandbox.workdir.rglob("*.py"))
            assert left == sorted(task.files), "grading leaves nothing behind in the repository"
            rewards[task.id] = unmodified.reward
    partial = [task_id for task_id, reward in rewards.items() if 0.0 < reward < 1.0]
    assert len(partial) >= len(rewards) // 2, f"partial credit on few tasks: {rewards}"


async def test_a_repository_that_does_not_import_or_hangs_fails_its_tests(tmp_path: Path) -> None:
    task = task_named("clamp")
    async with served_sandbox(tmp_path / "box") as sandbox, SandboxClient(await sandbox.claim()) as box:
        await lay_out(box, {"bounds.py": "def clamp(:\n"}, clear=True)
        broken = await grade(box, task)
        assert broken.reward == 0.0 and "do not import" in broken.error and "SyntaxError" in broken.error
        # Values above the range loop forever: those two tests time out, the others still count.
        looping = "def clamp(value, low, high):\n    while value > high:\n        pass\n    return max(value, low)\n"
        await lay_out(box, {"bounds.py": looping}, clear=True)
        hanging = await grade(box, task)
        assert hanging.reward == 0.6 and set(hanging.failed) == {
            "HiddenClampTest.test_above",
            "HiddenClampTest.test_floats_above",
        }
        assert all("timed out after 5 s" in why for why in hanging.failed.values())


def test_a_jail_slow_to_start_does_not_use_up_a_tests_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded host, the jail and its interpreter may take longer to start than a test may run: that
    start is not the graded code's time, so the solution still passes every test."""
    task = task_named("clamp")
    spawn = Jail.spawn

    def slow_spawn(jail: Jail, command: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
        return spawn(jail, ["sh", "-c", f'sleep {PER_TEST_S + 1:g}; exec "$@"', "sh", *command], **options)

    monkeypatch.setattr(Jail, "spawn", slow_spawn)
    files = {path: content.encode() for path, content in {**task.files, **task.solution}.items()}
    verdict = grade_in_jail(files, task.hidden_tests, SandboxIsolation.none)
    assert not verdict["error"] and sorted(verdict["passed"]) == sorted(task.hidden_test_names())


# A wrong solution that tries every way it has to pass anyway (tests.red_team.FORGER: it patches unittest,
# writes a verdict that passes every test to each file descriptor it holds, and exits 0 when called); then one
# whose `clamp` answers what it could find from its jail (the hidden tests, a nonce, another process), which
# the grader's failure reasons show.
LOOKER = """
import os
seen = []
# The whole tree the jail shows but the kernel's own views (a walk, not a glob: it has 5 s to import).
for folder, inside, names in os.walk("/"):
    if folder == "/":
        inside[:] = [name for name in inside if name not in ("proc", "sys")]
    seen.extend(os.path.join(folder, name) for name in names if name == "hidden_tests.py")
others = []
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
    try:
        others.append(open(f"/proc/{pid}/comm").read().strip())
    except OSError:  # it ended between the listing and the read: it is not there
        pass
environ = open("/proc/self/environ").read()
seen.append(f"others={others} nonce={'NONCE' in environ}")
def clamp(value, low, high):
    return " ".join(seen)
"""


async def test_a_wrong_solution_cannot_forge_its_grade(tmp_path: Path) -> None:
    task = task_named("clamp")
    forger = FORGER.replace("NAMES", json.dumps(list(task.hidden_test_names())))
    graded = await grade_files(
        {**{k: v.encode() for k, v in task.files.items()}, "bounds.py": forger.encode()},
        task,
        SandboxIsolation.bwrap,
    )
    assert graded.reward == 0.0 and not graded.passed, graded
    seen = await grade_files(
        {"bounds.py": (forger + LOOKER).encode()},
        task,
        SandboxIsolation.bwrap,
    )
    reasons = " ".join(seen.failed.values())
    # Alone in its PID namespace (but for bubblewrap's own init), with no secret in its environment.
    assert "others=['bwrap'] nonce=False" in reasons, seen
    assert "hidden_tests.py" not in reasons, "the hidden tests are nowhere in the graded code's jail"


def test_env_check_plays_the_coding_environment_to_reward_1() -> None:
    checked = subprocess.run(
        [ROLLOUT, "env", "check", "coding.environment:environment", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] and report["plays"] == [
        {"agent": "solver", "turns": 3, "reward": 1.0, "truncated": False, "tools": ["shell"]}
    ]


class _Graded(ShellCoding):
    """The shell task, keeping the grade it ended with: a failing assertion says what the grader said."""

    ended: End | None = None

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        observation = await super().respond(run, reply)
        if isinstance(observation, End):
            self.ended = observation
        return observation


async def test_the_scripted_solver_solves_every_task_through_the_shell_sandbox(tmp_path: Path) -> None:
    async with served_sandbox(tmp_path / "box") as sandbox:
        for task in coding_tasks():
            model = Replies(solve)
            seat = await sandbox.claim()
            graded = _Graded(task)
            played = await play(graded, context(seat, task.id), model, max_turns=environment.max_turns)
            said = graded.ended.content if graded.ended is not None else "no grade"
            assert played.reward == 1.0 and played.turns == 3, f"{task.id}: {said}"
            assert (
                played.metrics["tests_passed"]
                == played.metrics["tests_total"]
                == len(task.hidden_test_names())
            )
            assert played.metrics["shell_calls"] == 2 and played.metrics["tool_errors"] == 0
            shown = "\n".join(m.text for messages in model.sent for m in messages)
            assert task.hidden_tests not in shown and "Hidden" not in shown, (
                "the agent never sees hidden tests"
            )


async def test_broken_tool_calls_are_answered_with_tool_errors_and_the_episode_goes_on(
    tmp_path: Path,
) -> None:
    task = task_named("clamp")
    broken = [
        shell_call('{"command": "ls"}', name="bash"),
        shell_call("{not json"),
        shell_call('{"cmd": "ls"}'),
        shell_call("[1, 2]"),
        shell_call('{"command": "   "}'),
        shell_call('{"command": "ls", "timeout_s": "soon"}'),
        shell_call('{"command": "ls", "timeout_s": -1}'),
        shell_call('{"command": "ls", "timeout_s": 1e999}'),  # a float past range: inf
        shell_call("[" * 200_000),  # nested past the JSON parser's depth
    ]
    replies = [*broken, shell_call('{"command": "ls"}'), Message.assistant("I give up.")]
    model = Replies(lambda messages, tools: replies[sum(m.role == "assistant" for m in messages)])
    async with served_sandbox(tmp_path / "box") as sandbox:
        played = await play(ShellCoding(task), context(await sandbox.claim()), model, max_turns=20)
    answers = [messages[-1].text for messages in model.sent[1:]]
    assert [answer.startswith("error:") for answer in answers] == [True] * len(broken) + [False]
    assert "there is no tool 'bash'" in answers[0] and "not JSON" in answers[1]
    assert all('"command"' in answer for answer in answers[2:5]) and "timeout_s" in answers[5]
    assert "timeout_s" in answers[7] and "nested too deeply" in answers[8], answers[7:9]
    assert answers[-1].startswith("exit code 0") and "bounds.py" in answers[-1]
    assert 0.0 < played.reward < 1.0, "the unmodified repository is graded with partial credit"
    assert played.metrics["tool_errors"] == len(broken) and played.metrics["shell_calls"] == 1


async def test_the_last_turn_hands_the_repository_in(tmp_path: Path) -> None:
    task = task_named("leap-year")
    replies = [
        shell_call(json.dumps({"command": write_files_command(task.solution)})),
        shell_call('{"command": "ls"}'),
    ]
    model = Replies(lambda messages, tools: replies[sum(m.role == "assistant" for m in messages)])
    async with served_sandbox(tmp_path / "box") as sandbox:
        played = await play(
            ShellCoding(task, max_turns=2), context(await sandbox.claim()), model, max_turns=2
        )
    assert played.reward == 1.0 and not played.truncated and played.metrics["out_of_turns"] == 1.0


# The agent's script runs jailed on the project's interpreter, where neither rollout nor the coding package
# can be imported: the test writes the solution into the script.
SCRIPT_AGENT = """
import json, os, pathlib, sys
files, solution = json.loads(sys.argv[1])
here = pathlib.Path.cwd()
assert here.name == "repo" and sorted(p.name for p in here.iterdir()) == sorted({f.split("/")[0] for f in files})
for top in ("/sandbox", "/tmp", "/root", "/work", "/home"):
    assert not list(pathlib.Path(top).rglob("hidden_tests.py")), f"the hidden tests are not in the jail's {top}"
for module in ("coding", "rollout"):
    try:
        __import__(module)
    except ImportError:
        continue
    raise AssertionError(f"{module} is importable in the agent's jail")
for path, text in solution.items():
    (here / path).write_text(text)
(here / "scratch.txt").write_text("an agent's own notes are handed in too")
print("fixed")
"""


async def play_command(
    sandbox: Sandbox, task_id: str, command: tuple[str, ...]
) -> tuple[float, dict[str, float]]:
    task = CommandCoding(task_named(task_id), "plain")

    async def no_turns() -> int:
        return 0

    played = await play_external(
        task,
        context(await sandbox.claim()),
        command,
        base_url="http://127.0.0.1:9",
        token="seat-token",
        timeout_s=60,
        count_turns=no_turns,
    )
    return played.reward, played.metrics


async def test_a_command_agent_works_on_a_copy_of_the_repository_graded_in_a_jail_of_its_own(
    tmp_path: Path,
) -> None:
    task = task_named("durations")
    knowledge = json.dumps([sorted(task.files), task.solution])
    scripted = command_agent("plain", (sys.executable, "-c", SCRIPT_AGENT, knowledge)).agent("solver").command
    idle = command_agent("plain", ("true",)).agent("solver").command
    async with served_sandbox(tmp_path / "box") as sandbox:
        reward, metrics = await play_command(sandbox, "durations", scripted)
        assert reward == 1.0 and metrics["tests_passed"] == metrics["tests_total"] == 5
        seat = sandbox.workdir / seat_folder(0)
        assert not (seat / "scratch.txt").exists(), "finish graded a copy of the agent's files, elsewhere"
        reward, metrics = await play_command(sandbox, "durations", idle)
        assert reward == 0.4 and metrics["tests_passed"] == 2, (
            "an agent that changes nothing gets partial credit"
        )
        reward, metrics = await play_command(sandbox, "durations", ("sh", "-c", "cd .. && rm -rf repo"))
        assert reward == 0.0 and metrics["tests_passed"] == 0, "a command that removes its repository"
        host = tmp_path / "host-files"
        host.mkdir()
        (host / "operator.key").write_text("the host's key")
        linked = ("sh", "-c", f"cd .. && rm -rf repo && ln -s {host} repo")
        reward, metrics = await play_command(sandbox, "durations", linked)
        assert reward == 0.0 and metrics["tests_passed"] == 0, (
            "a link in place of the repository is no repository"
        )
        assert not list(sandbox.workdir.rglob("operator.key")), "finish read nothing the link pointed to"


async def test_prepare_copies_the_repository_out_and_configures_codex(tmp_path: Path) -> None:
    task = task_named("inventory")
    async with served_sandbox(tmp_path / "box") as sandbox:
        seat = await sandbox.claim()
        async with SandboxClient(seat) as box:
            await lay_out(box, dict(task.files), clear=True, folder=seat_folder(seat.seat))
            copied = await read_back(box, folder=seat_folder(seat.seat))
            assert {name: data.decode() for name, data in copied.items()} == task.files
        work = tmp_path / "work"
        work.mkdir()
        setup = CommandSetup(
            workdir=work, inside="/sandbox", environment={"OPENAI_BASE_URL": "http://gateway.test/s/tok/v1"}
        )
        await CommandCoding(task, "codex").prepare(context(seat), setup)
        assert setup.cwd == "repo"
        laid = {p.relative_to(work / "repo").as_posix() for p in (work / "repo").rglob("*") if p.is_file()}
        assert laid == set(task.files)
        config = (work / "home" / ".codex" / "config.toml").read_text()
        assert (
            'base_url = "http://gateway.test/s/tok/v1"' in config and 'env_key = "ROLLOUT_API_KEY"' in config
        )
        assert setup.environment["CODEX_HOME"] == "/sandbox/home/.codex", (
            "the path the command sees, in its jail"
        )
        stale = replace(seat, epoch=0)  # an older claim: the sandbox refuses it
        with pytest.raises(SandboxRefused):
            await CommandCoding(task, "plain").prepare(
                context(stale), replace(setup, workdir=tmp_path / "late")
            )


@pytest.mark.parametrize("reference", ["coding.environment:claude_code", "coding.environment:codex"])
async def test_the_command_agent_variants_pass_env_check(reference: str) -> None:
    report = await check_environment(reference)
    assert report.ok, report.findings
    from rollout.environment import load_environment

    loaded = load_environment(reference)
    assert "{prompt}" in loaded.agent("solver").command
    flavour = reference.rpartition(":")[2].replace("_", "-")
    task = loaded.make_task(loaded.source.parameters(0), "solver")
    assert isinstance(task, CommandCoding) and task.flavour == flavour
