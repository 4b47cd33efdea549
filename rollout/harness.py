"""What an environment author writes: a `Task` that answers an agent's replies with observations.

Contract:
- `Task.start` returns the first observation; `Task.respond` answers each assistant reply. Returning an
  `End` finishes the agent's episode with its reward.
- `End` is an `Observation` (the final one), so `respond` is typed to return `Observation` and may end at
  any point. An `End` may carry a last text for the agent's transcript; it is never sent to the model.
- Rewards are floats per agent seat; a multi-seat task returns its own seat's reward from its own `End`.
- `RunContext` tells a task which run, episode, seat and attempt it plays in; a task uses it for
  logging and for seeding, never to reach into the platform's state. When the environment needs a sandbox,
  `run.sandbox` is this agent's seat in the episode's claimed sandbox (reach it with
  `rollout.sandbox.SandboxClient`); every agent of the episode is in the same sandbox. `run.isolation` is how
  this machine confines agents' commands: a Task that runs the agent's code itself (a grader) jails it alike.
- A seat played by an external command (Claude Code, Codex, a script): `start` gives the prompt the command is
  started with, `prepare` fills its working directory and may add to its environment before it starts (the
  Task's own code, run outside the command's jail: it may reach the sandbox, the command may not), and
  `finish` scores the command's outcome when it ends. `respond` is never called.
- The policy writes its tool calls, so a malformed one is the policy's mistake, never the environment's
  failure: `tool_arguments(call)` is a call's arguments as a JSON object, or `BadToolCall` (a `ValueError`)
  whose message is what to tell the policy, whatever the text (not JSON, nested past any depth, not an
  object); `finite_number` checks a number the policy gave. A task answers a `BadToolCall` with an error
  observation and the episode goes on.
"""

from __future__ import annotations

import abc
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.contracts import Message, ToolCall, ToolSpec
from rollout.security.isolation import SandboxIsolation

# The author API: what an environment's author imports (kept stable across releases).
__all__ = [
    "BadToolCall",
    "CommandOutcome",
    "CommandSetup",
    "End",
    "Observation",
    "RunContext",
    "SandboxSeat",
    "Task",
    "finite_number",
    "tool_arguments",
]


@dataclass(frozen=True)
class Observation:
    """What the environment shows the agent next: text, or whole messages (tool results, several turns)."""

    content: str | tuple[Message, ...] = ""
    tools: tuple[ToolSpec, ...] = ()

    def messages(self) -> tuple[Message, ...]:
        """The observation as messages to append to the agent's conversation."""
        if isinstance(self.content, str):
            return (Message.user(self.content),) if self.content else ()
        return self.content


@dataclass(frozen=True)
class End(Observation):
    """The episode is over for this agent, with this reward."""

    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict[str, float])


@dataclass(frozen=True)
class SandboxSeat:
    """An agent's place in a claimed sandbox: the server, the claim's epoch (its fence) and the seat number,
    and the claim's secret that proves it to the server (rollout.sandbox.keys; never shown to an agent)."""

    address: str
    kind: str
    name: str
    epoch: int
    seat: int
    holder: str = ""
    secret: str = field(default="", repr=False)
    gateway_url: str = field(default="", repr=False)  # the seat's own gateway routes (network `gateway` only)


@dataclass(frozen=True)
class RunContext:
    """Where a task is being played. `attempt` counts from 1 and grows when an episode is retried."""

    run: str
    episode: str
    seat: str
    attempt: int = 1
    parameters: dict[str, str] = field(default_factory=dict[str, str])
    sandbox: SandboxSeat | None = None
    isolation: SandboxIsolation = SandboxIsolation.bwrap  # this runner's `sandbox.isolation`


@dataclass(frozen=True)
class CommandOutcome:
    """How an external agent command ended: its exit code, its output (stdout and stderr, the tail kept), the
    directory it ran in, and the turns it sampled through its seat."""

    exit_code: int | None
    output: str
    workdir: str
    turns: int
    timed_out: bool = False


@dataclass
class CommandSetup:
    """How a command seat's command starts; the Task's `prepare` may fill the folder and change the rest."""

    workdir: Path  # the command's working directory on this machine: the only place it may write
    inside: str  # the same folder as the command sees it (`/sandbox` in its jail): what `{workdir}` becomes
    environment: dict[str, str]  # its variables (the seat's base URLs and key, the prompt, HOME): add to them
    cwd: str = ""  # where in `workdir` it starts: "" for `workdir` itself, or a folder prepare made there


class Task(abc.ABC):
    """One episode's environment, from one agent's point of view."""

    @abc.abstractmethod
    async def start(self, run: RunContext) -> Observation:
        """The first observation of the episode."""

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        """Answer the agent's reply: a next observation, or `End` with a reward (the built-in loop)."""
        raise NotImplementedError(
            f"{type(self).__name__} is played by the built-in loop: implement Task.respond to answer replies"
        )

    async def prepare(self, run: RunContext, setup: CommandSetup) -> None:
        """Before an external command starts: lay out what it works on in `setup.workdir` (nothing by
        default)."""
        return None

    async def finish(self, run: RunContext, outcome: CommandOutcome) -> End:
        """Score an external agent command that has ended (a seat with a `command`)."""
        raise NotImplementedError(
            f"{type(self).__name__} is played by an external command: implement Task.finish to score its outcome"
        )


class BadToolCall(ValueError):
    """A tool call the policy got wrong: the message says what, for the policy to read."""


def tool_arguments(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as a JSON object (`{}` when it gave none)."""
    try:
        parsed = json.loads(call.arguments or "{}")
    except (ValueError, RecursionError) as error:  # RecursionError: brackets nested past the parser's depth
        detail = str(error) if isinstance(error, ValueError) else "nested too deeply"
        raise BadToolCall(f"the arguments of {call.name} are not JSON ({detail})") from None
    if not isinstance(parsed, dict):
        raise BadToolCall(f"the arguments of {call.name} must be a JSON object")
    return parsed


def finite_number(value: object, name: str, *, low: float, high: float) -> float:
    """`value` as a float in [low, high]: a JSON number (not a bool), finite; else `BadToolCall` naming
    `name`."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadToolCall(f'"{name}" must be a number, not {json.dumps(value)[:40]}')
    try:
        number = float(value)
    except OverflowError:  # an integer with hundreds of digits
        number = math.inf
    if not (math.isfinite(number) and low <= number <= high):
        raise BadToolCall(f'"{name}" must be a number from {low:g} to {high:g}')
    return number
