"""External agent loops: a command (Claude Code, Codex, a script) plays a seat; the Task scores how it ended.

Contract:
- The Task's first observation is the prompt. The command's arguments may say `{prompt}` and `{workdir}`;
  it also finds the prompt in `ROLLOUT_PROMPT`, and its seat in the usual variables of both dialects
  (`OPENAI_BASE_URL`/`OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`) plus `ROLLOUT_BASE_URL`/
  `ROLLOUT_API_KEY`. Nothing of the sandbox (its address, its claim's secret) reaches it: the Task's own
  `prepare` and `finish` work with the sandbox.
- It runs jailed, in this runner's jail (rollout.sandbox.seat_jail; unjailed only with isolation `none`), or,
  with `hosts` (`sandbox.command_pool`), on a command host claimed for this one command
  (rollout.sandbox.remote_seat: the Task's folder travels there and back; no host free in time fails the
  seat with `NoSandboxFree`, a host lost meanwhile with `TaskFailed`). Either way: in a fresh working
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

import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import httpx

from rollout.activities.agent_loop import LoopOutcome, TaskFailed, checked_reward, defined_at, task_call
from rollout.config import SandboxIsolation
from rollout.environment import TURN_TIMEOUT_S
from rollout.harness import CommandOutcome, CommandSetup, End, RunContext, Task
from rollout.run.failures import NO_SANDBOX_FREE, TASK_FAILED, Failure, one_line
from rollout.sandbox.claims import NoSandboxFree, SandboxPool
from rollout.sandbox.client import SandboxLost, SandboxSuperseded
from rollout.sandbox.jail import JailUnavailable
from rollout.sandbox.programs import ProgramNotFound
from rollout.sandbox.remote_seat import remote_seat
from rollout.sandbox.seat_jail import seat_jail, seat_variables
from rollout.security.bounded_process import ProcessOutcome

OUTPUT_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class CommandHosts:
    """Command seats run on hosts of this pool (`sandbox.command_pool`), claimed with the runner's key."""

    pool: SandboxPool
    kind: str


class CommandPlace(Protocol):
    """Where a command seat's command runs: this runner's jail (`SeatJail`), or a command host
    (`RemoteSeat`)."""

    @property
    def workdir(self) -> Path: ...

    @property
    def inside(self) -> str: ...

    @property
    def base_url(self) -> str: ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        timeout_s: float,
        max_output_bytes: int,
        keep: Literal["head", "tail"] = "tail",
    ) -> ProcessOutcome: ...


def seat_environment(base_url: str, token: str, prompt: str, context: RunContext) -> dict[str, str]:
    """The variables that point a command at its seat, in every dialect's spelling."""
    variables = seat_variables(base_url, token) | {
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
    packages: Sequence[str] = (),
    hosts: CommandHosts | None = None,
) -> LoopOutcome:
    """Start the command on the seat (in this runner's jail, or on a command host of `hosts`), wait for it,
    and have the Task score it (each Task call bounded by `turn_timeout_s`; the command by `timeout_s`)."""
    package = type(task).__module__
    first = await task_call(task.start(context), "start", package, turn_timeout_s, type(task).start)
    prompt = "\n\n".join(m.text for m in first.messages() if m.text)
    place: contextlib.AbstractAsyncContextManager[CommandPlace] = (
        remote_seat(
            hosts.pool,
            hosts.kind,
            f"{context.run}/{context.seat}",
            program=command[0],
            gateway_url=base_url,
            token=token,
            readable=readable,
            packages=packages,
            timeout_s=timeout_s,
        )
        if hosts is not None
        else seat_jail(
            command[0],
            gateway_url=base_url,
            token=token,
            isolation=isolation,
            readable=readable,
            packages=packages,
        )
    )
    try:
        async with place as seat:
            done, end, turns = await _play_in(
                seat, task, context, command, prompt, token, timeout_s, count_turns, turn_timeout_s
            )
    except NoSandboxFree as error:
        raise TaskFailed(Failure(NO_SANDBOX_FREE, one_line(str(error)))) from error
    except (
        SandboxLost,
        SandboxSuperseded,
        httpx.HTTPError,
    ) as error:  # a host's 5xx, a command past its time
        reason = one_line(f"the agent command {command[0]!r} lost its command host: {error}")
        raise TaskFailed(Failure(TASK_FAILED, reason)) from error
    except (
        ProgramNotFound,
        JailUnavailable,
        ValueError,
    ) as error:  # ValueError: a seat's paths the jail refuses, an order the command host refuses
        reason = one_line(f"the agent command {command[0]!r} cannot start: {error}")
        raise TaskFailed(Failure(TASK_FAILED, reason)) from error
    return LoopOutcome(
        checked_reward(end, defined_at(type(task).finish)),
        turns,
        truncated=done.timed_out,
        metrics=dict(end.metrics),
    )


async def _play_in(
    seat: CommandPlace,
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
