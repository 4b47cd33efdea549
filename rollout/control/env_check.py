"""`rollout env check`: does an environment load, declare sane tools, and play an episode to a finite reward?

Contract:
- `check_environment(reference)` never raises for a broken environment: every problem becomes a `Finding`
  naming what is wrong and where (the reference, the agent, the tool, the turn). `CheckReport.ok` is True only
  when there are no findings.
- Each agent seat plays one episode of each of the first `tasks` groups (1 by default) with the built-in loop
  against a scripted model, in process (no services needed): the environment's own `scripted_reply` when it
  has one, else a model that answers "ok". A seat with an external command is started only by a run; the
  check validates its Task's first observation. A task source that raises for one group is a finding, and
  the check goes on with the next.
- The check bounds the environment's code as a run does (`Environment.turn_timeout_s` per Task call,
  `episode_timeout_s` per seat): a call that raises or runs past its limit is a finding naming the method,
  the reason and its place in the environment's code (rollout.run.failures). `progress` hears each turn
  played.
- An environment that needs a sandbox gets one of its kind, served in process on a local port for the check
  (claimed under epoch 1); its agents then play at the same time, each on its seat, as in a run. A kind that
  runs agents' commands runs them under `isolation` (jailed by default): where no jail can be made, that is a
  finding saying how to fix it.
"""

from __future__ import annotations

import asyncio
import functools
import re
import secrets
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rollout.activities.agent_loop import EpisodeFault, LoopOutcome, in_thread, play, task_call
from rollout.config import SandboxIsolation
from rollout.contracts import Message, ToolSpec
from rollout.environment import Environment, EnvironmentLoadError, SandboxSpec, load_environment
from rollout.harness import RunContext, SandboxSeat
from rollout.net import serving
from rollout.run.failures import TASK_FAILED, failure_in
from rollout.sandbox import SandboxClient
from rollout.sandbox.hosting import build_world
from rollout.sandbox.jail import JailUnavailable
from rollout.sandbox.keys import claim_secret, kind_key
from rollout.sandbox.server import build_sandbox_app

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ScriptedReply = Callable[[list[Message], tuple[ToolSpec, ...]], Message]


@dataclass(frozen=True)
class Finding:
    where: str
    problem: str


@dataclass(frozen=True)
class AgentPlay:
    agent: str
    turns: int
    reward: float | None
    truncated: bool
    tools: list[str]


@dataclass
class CheckReport:
    reference: str
    environment: str | None = None
    plays: list[AgentPlay] = field(default_factory=list[AgentPlay])
    findings: list[Finding] = field(default_factory=list[Finding])

    @property
    def ok(self) -> bool:
        return not self.findings


def tool_problems(tool: ToolSpec) -> list[str]:
    problems = []
    if not TOOL_NAME.match(tool.name):
        problems.append(f"tool name {tool.name!r} must be 1-64 letters, digits, '_' or '-'")
    schema = tool.parameters
    if schema.get("type") != "object":
        problems.append(f"tool {tool.name!r}: parameters must be a JSON schema of type 'object'")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        problems.append(f"tool {tool.name!r}: 'properties' must be an object")
    else:
        for required in schema.get("required", []):
            if required not in properties:
                problems.append(f"tool {tool.name!r}: required parameter {required!r} is not in 'properties'")
    return problems


class _Scripted:
    """The scripted model of the check, recording the tools it was offered."""

    def __init__(self, reply: ScriptedReply | None, limit_s: float) -> None:
        self.reply_with = reply
        self.limit_s = limit_s
        self.tools_seen: dict[str, ToolSpec] = {}

    async def reply(self, messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
        for tool in tools:
            self.tools_seen[tool.name] = tool
        if self.reply_with is None:
            return Message.assistant("ok")
        reply_with, package = self.reply_with, getattr(self.reply_with, "__module__", None) or ""
        return await task_call(
            in_thread(lambda: reply_with(messages, tools)),
            "scripted_reply",
            package,
            self.limit_s,
            reply_with,
        )


async def check_environment(
    reference: str | Environment,
    *,
    isolation: SandboxIsolation = SandboxIsolation.bwrap,
    tasks: int = 1,
    progress: Callable[[str], None] = lambda _: None,
) -> CheckReport:
    """Check the environment at `reference` (package.module:attribute), or one already in hand, on its first
    `tasks` tasks (groups 0, 1, …)."""
    if isinstance(reference, Environment):
        environment, reference = reference, reference.name
        report = CheckReport(reference)
    else:
        report = CheckReport(reference)
        try:
            environment = load_environment(reference)
        except EnvironmentLoadError as error:
            report.findings.append(Finding(reference, str(error)))
            return report
    report.environment = environment.name
    for group in range(tasks):
        where = reference if tasks == 1 else f"{reference} task {group}"
        source, doing = environment.source, f"the task source's draw {group}"
        package, limit_s = reference.partition(":")[0], environment.turn_timeout_s
        try:
            parameters = await task_call(
                in_thread(functools.partial(source.parameters, group)),
                doing,
                package,
                limit_s,
                type(source).parameters,
            )
        except EpisodeFault as error:
            report.findings.append(Finding(f"{where} task source", error.failure.summary))
            continue
        progress(f"{where}: playing")
        await _check_task(environment, where, parameters, report, isolation, progress)
    return report


async def _check_task(
    environment: Environment,
    where: str,
    parameters: dict[str, str],
    report: CheckReport,
    isolation: SandboxIsolation,
    progress: Callable[[str], None],
) -> None:
    """Every seat of one task played: one after another, or at once on a sandbox's seats."""
    seats = [(agent.name, bool(agent.command)) for agent in environment.agents]
    if environment.sandbox is None:
        for agent, external in seats:
            await _check_agent(
                environment, where, agent, external, parameters, report, None, isolation, progress
            )
        return
    async with _sandbox_for_check(environment.sandbox, where, report, isolation) as sandbox:
        if sandbox is not None:
            await asyncio.gather(
                *(
                    _check_agent(
                        environment,
                        where,
                        agent,
                        external,
                        parameters,
                        report,
                        sandbox[i],
                        isolation,
                        progress,
                    )
                    for i, (agent, external) in enumerate(seats)
                )
            )


@asynccontextmanager
async def _sandbox_for_check(
    need: SandboxSpec, task: str, report: CheckReport, isolation: SandboxIsolation
) -> AsyncIterator[list[SandboxSeat] | None]:
    where = f"{task} sandbox {need.kind!r}"
    workdir = Path(tempfile.mkdtemp(prefix="rollout-env-check-"))
    try:
        world = build_world(need.kind, workdir, need.seats, isolation)
    except JailUnavailable as error:
        report.findings.append(Finding(where, f"its commands run in a jail, but {error}"))
        yield None
        return
    except Exception as error:
        report.findings.append(Finding(where, f"{type(error).__name__}: {error}"))
        yield None
        return
    key = secrets.token_bytes(32)  # this check's own: no other process may act in its sandbox
    secret = claim_secret(key, need.kind, "env-check", 1, "env-check")
    try:
        async with serving(
            build_sandbox_app(
                world, kind=need.kind, name="env-check", seats=need.seats, key=kind_key(key, need.kind)
            )
        ) as url:
            seats = [
                SandboxSeat(
                    address=url,
                    kind=need.kind,
                    name="env-check",
                    epoch=1,
                    seat=seat,
                    holder="env-check",
                    secret=secret,
                )
                for seat in range(need.seats)
            ]
            try:
                async with SandboxClient(seats[0]) as opener:
                    limits = need.limits.as_json() if need.limits else None
                    await opener.open(limits=limits, network=need.access.entries())
            except Exception as error:  # its world did not come up: say why, play nothing
                report.findings.append(Finding(where, f"the sandbox did not open: {error}"))
                yield None
                return
            yield seats
    finally:
        await world.close()


async def _check_agent(
    environment: Environment,
    task_where: str,
    agent: str,
    external: bool,
    parameters: dict[str, str],
    report: CheckReport,
    sandbox: SandboxSeat | None,
    isolation: SandboxIsolation,
    progress: Callable[[str], None],
) -> None:
    where = f"{task_where} agent {agent!r}"
    context = RunContext(
        run="env-check",
        episode="episode-0",
        seat=f"env-check/{agent}",
        attempt=1,
        parameters=parameters,
        sandbox=sandbox,
        isolation=isolation,
    )
    try:
        task = environment.make_task(parameters, agent)
    except Exception as error:
        package = getattr(environment.make_task, "__module__", None) or ""
        report.findings.append(Finding(where, failure_in(error, TASK_FAILED, "make_task", package).summary))
        return
    model = _Scripted(environment.scripted_reply, environment.turn_timeout_s)
    outcome: LoopOutcome | None = None
    limit_s = environment.episode_timeout_s
    try:
        async with asyncio.timeout(limit_s):
            if external:
                first = await task_call(
                    task.start(context), "start", type(task).__module__, environment.turn_timeout_s
                )
                for tool in first.tools:
                    model.tools_seen[tool.name] = tool
            else:
                outcome = await play(
                    task,
                    context,
                    model,
                    max_turns=environment.max_turns,
                    turn_timeout_s=environment.turn_timeout_s,
                    on_turn=lambda turn: progress(f"{where}: turn {turn} of at most {environment.max_turns}"),
                )
    except EpisodeFault as error:
        report.findings.append(Finding(where, error.failure.summary))
    except TimeoutError:
        reason = f"the episode did not end within {limit_s:g} s (Environment.episode_timeout_s)"
        report.findings.append(Finding(where, reason))
    except Exception as error:
        report.findings.append(Finding(where, f"{type(error).__name__}: {error}"))
    for tool in model.tools_seen.values():
        report.findings.extend(Finding(f"{where} tool {tool.name!r}", p) for p in tool_problems(tool))
    played = AgentPlay(agent=agent, turns=0, reward=None, truncated=False, tools=sorted(model.tools_seen))
    if outcome is not None:
        played = AgentPlay(
            agent=agent,
            turns=outcome.turns,
            reward=outcome.reward,
            truncated=outcome.truncated,
            tools=played.tools,
        )
    report.plays.append(played)
