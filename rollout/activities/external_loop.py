"""External agent loops: a command (Claude Code, Codex, a script) plays a seat; the Task scores how it ended.

Contract:
- The Task's first observation is the prompt. The command's arguments may say `{prompt}` and `{workdir}`;
  it also finds the prompt in `ROLLOUT_PROMPT`, and its seat in the usual variables of both dialects
  (`OPENAI_BASE_URL`/`OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`) plus `ROLLOUT_BASE_URL`/
  `ROLLOUT_API_KEY`. Nothing of the sandbox (its address, its claim's secret) reaches it: the Task's own
  `prepare` and `finish` work with the sandbox.
- It runs jailed (rollout.sandbox.seat_jail; unjailed only with isolation `none`): in a fresh working
  directory (`{workdir}`, `/sandbox` as it sees it) with a home of its own (`{workdir}/home`, HOME), able to
  read only the system, its program's install and the seat's `readable` paths, and to reach only its own
  seat's gateway routes (the base URLs above), for at most `timeout_s`; on a timeout or a cancelled activity
  every process it started is killed. Before it starts, `Task.prepare` fills the directory
  (rollout.harness.CommandSetup). The last `OUTPUT_TAIL_BYTES` of its output are kept. A program that is not
  on this machine, or a jail that cannot be made, fails the seat (`TaskFailed`), as does a Task call
  (`start`, `prepare`, `finish`) that raises or runs past `turn_timeout_s`.
- When it ends, `Task.finish(run, CommandOutcome)` gives the seat's `End` (its reward); the turns are what the
  gateway recorded on the seat.
- A command is not replayable: the workflow gives every attempt a fresh seat.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence

from rollout.activities.agent_loop import LoopOutcome, TaskFailed, checked_reward, defined_at, task_call
from rollout.bounded_process import ProcessOutcome
from rollout.config import SandboxIsolation
from rollout.environment import TURN_TIMEOUT_S
from rollout.failures import TASK_FAILED, Failure, one_line
from rollout.harness import CommandOutcome, CommandSetup, End, RunContext, Task
from rollout.sandbox.jail import JailUnavailable
from rollout.sandbox.programs import ProgramNotFound
from rollout.sandbox.seat_jail import SeatJail, seat_jail

OUTPUT_TAIL_BYTES = 64 * 1024


def seat_environment(base_url: str, token: str, prompt: str, context: RunContext) -> dict[str, str]:
    """The variables that point a command at its seat, in every dialect's spelling."""
    variables = {
        "OPENAI_BASE_URL": f"{base_url}/s/{token}/v1",
        "OPENAI_API_KEY": token,
        "ANTHROPIC_BASE_URL": f"{base_url}/s/{token}",
        "ANTHROPIC_API_KEY": token,
        "ROLLOUT_BASE_URL": f"{base_url}/s/{token}/v1",
        "ROLLOUT_API_KEY": token,
        "ROLLOUT_PROMPT": prompt,
        "ROLLOUT_RUN": context.run,
        "ROLLOUT_EPISODE": context.episode,
        "ROLLOUT_SEAT": context.seat,
    }
    return variables


async def play_external(
    task: Task,
    context: RunContext,
    command: Sequence[str],
    *,
    base_url: str,
    token: str,
    timeout_s: float,
    count_turns: Callable[[], Awaitable[int]],
    turn_timeout_s: float = TURN_TIMEOUT_S,
    isolation: SandboxIsolation = SandboxIsolation.bwrap,
    readable: Sequence[str] = (),
) -> LoopOutcome:
    """Start the command on the seat, wait for it, and have the Task score it (each Task call bounded by
    `turn_timeout_s`; the command by `timeout_s`)."""
    package = type(task).__module__
    first = await task_call(task.start(context), "start", package, turn_timeout_s, type(task).start)
    prompt = "\n\n".join(m.text for m in first.messages() if m.text)
    try:
        async with seat_jail(
            command[0], gateway_url=base_url, token=token, isolation=isolation, readable=readable
        ) as seat:
            done, end, turns = await _play_in(
                seat, task, context, command, prompt, token, timeout_s, count_turns, turn_timeout_s
            )
    except (
        ProgramNotFound,
        JailUnavailable,
        ValueError,
    ) as error:  # ValueError: a seat's paths the jail refuses
        reason = one_line(f"the agent command {command[0]!r} cannot start: {error}")
        raise TaskFailed(Failure(TASK_FAILED, reason)) from error
    return LoopOutcome(
        checked_reward(end, defined_at(type(task).finish)),
        turns,
        truncated=done.timed_out,
        metrics=dict(end.metrics),
    )


async def _play_in(
    seat: SeatJail,
    task: Task,
    context: RunContext,
    command: Sequence[str],
    prompt: str,
    token: str,
    timeout_s: float,
    count_turns: Callable[[], Awaitable[int]],
    turn_timeout_s: float = TURN_TIMEOUT_S,
) -> tuple[ProcessOutcome, End, int]:
    (seat.workdir / "home").mkdir()
    inside = seat.inside
    env = seat_environment(seat.base_url, token, prompt, context) | {"HOME": f"{inside}/home"}
    setup = CommandSetup(workdir=seat.workdir, inside=inside, environment=env)
    package = type(task).__module__
    await task_call(task.prepare(context, setup), "prepare", package, turn_timeout_s, type(task).prepare)
    argv = [part.replace("{prompt}", prompt).replace("{workdir}", inside) for part in command]
    if "/" in argv[0] and not argv[0].startswith("/"):
        # The jail starts elsewhere: the program where the runner found it.
        argv[0] = f"{os.getcwd()}/{argv[0]}"
    done = await seat.run(
        argv,
        env=setup.environment,
        cwd=setup.cwd,
        timeout_s=timeout_s,
        max_output_bytes=OUTPUT_TAIL_BYTES,
        keep="tail",
    )
    turns = await count_turns()
    outcome = CommandOutcome(
        exit_code=done.exit_code,
        output=done.output,
        workdir=str(seat.workdir),
        turns=turns,
        timed_out=done.timed_out,
    )
    end = await task_call(task.finish(context, outcome), "finish", package, turn_timeout_s, type(task).finish)
    return done, end, turns
