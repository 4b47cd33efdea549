"""Environments: what a run plays. An environment bundles a task source, the agent seats of an episode, and
how to make each seat's `Task`; `load_environment("package.module:attribute")` finds one.

Contract:
- Task sources (rollout.task_sources: `Dataset`, `Generator`, `HFDataset` from `Dataset.from_hf` or
  `Dataset.from_files`) are deterministic by index: `parameters(group)` is the same on every machine and every
  retry, so workflows pass only the group index and each runner rebuilds the task itself (nothing heavy
  crosses Temporal).
- Every episode of a group plays the same parameters (group-relative advantages compare like with like).
- An episode has one seat per `AgentSeatSpec`; each seat has its own `Task` (made by `make_task(parameters,
  agent)`) and its own reward. A seat uses the built-in loop (the Task talks to the model through the gateway)
  unless it names an external `command` (Claude Code, Codex, a script), which is started with the seat's base
  URL and key in its environment; the Task then scores the outcome when the command ends. A seat's
  `checkpoint` pins it, never trained, to a fixed checkpoint or to one of its own policy's lineage in the run
  (`latest`, `latest-K`, `sample`, `sample-N`: rollout.run.pins; a malformed pin raises here). A seat naming a
  `model` (LiteLLM) is answered by that model, an opponent or judge recorded as text and never trained; its
  policy trains nothing. Every other seat trains its policy, built-in loop and command alike.
- A policy samples and trains `trainer.model` unless the environment's `policy_models` (or the config's
  `policies.NAME.model`) puts it on a base model of its own; `policy_models` naming a policy no agent plays
  raises here.
- A command may hold several conversations on its seat (rewrites, side tasks): each is its own segment, and
  `trains(Conversation)` decides which train (all, by default).
- `eval_source` is the held-out task set evals draw from (rollout.evals): tasks training never draws. A
  `Generator` environment holds out a seed of its own; a `Dataset` one, rows it leaves out of `source`.
  `task_source(selection)` is the source a selection names: `train` (the source), `eval` (the held-out one),
  or `seed:N` (the generator's tasks under seed N).
- `replayable` says whether a retried attempt may resume by replay (the same requests get the recorded
  replies). An environment with outside state (a live world) sets it False: a retried attempt is abandoned and
  a fresh one starts.
- `load_environment` raises `EnvironmentLoadError` naming the reference and what is wrong with it.
- `AgentSeatSpec` and `SandboxSpec` are what workflow code knows of an environment's seats and sandbox
  (rollout.workflows.episode_types.EnvironmentInfo): they cross Temporal's JSON data converter as they are
  (strings, numbers, tuples, `JailLimits`), and this module imports only the standard library and light core
  modules at run time (what a `Task` or a `Message` is matters to type checkers only), so workflow code may
  import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rollout.references import ReferenceLoadError, import_reference
from rollout.run.pins import RelativePin, parse_pin
from rollout.security.isolation import JailLimits, SandboxNetwork
from rollout.task_sources import Dataset, Generator, HFDataset, HFDatasetError, TaskParameters, TaskSource

if TYPE_CHECKING:  # annotations only: workflow code imports this module, and pydantic is not light
    from rollout.contracts import Message, ToolSpec
    from rollout.harness import Task

# The author API: what an environment's author imports (kept stable across releases).
__all__ = [
    "EVAL_TASKS",
    "TRAIN_TASKS",
    "AgentSeatSpec",
    "Conversation",
    "Dataset",
    "Environment",
    "EnvironmentLoadError",
    "Generator",
    "HFDataset",
    "HFDatasetError",
    "SandboxSpec",
    "TaskParameters",
    "TaskSource",
    "load_environment",
]

TRAIN_TASKS = "train"
EVAL_TASKS = "eval"


class EnvironmentLoadError(ValueError):
    """The reference does not name an importable environment."""


@dataclass(frozen=True)
class AgentSeatSpec:
    """One agent of an episode: the policy it samples (or a pinned checkpoint), and its loop."""

    name: str = "solver"
    policy: str = "default"
    checkpoint: str | None = None
    command: tuple[str, ...] = ()  # an external agent loop; empty for the built-in one
    timeout_s: float = 1800.0  # an external command is killed after this long
    # What else of this machine an external command reads (its script, its data), read-only at the same path
    # in its jail; the install of its program (and of a script's interpreter) is found without being named.
    readable: tuple[str, ...] = ()
    # The Python distributions (with what they require) a Python command imports from its interpreter's
    # environment, say ("openai",): nothing else installed there is in its jail (rollout.sandbox.programs).
    packages: tuple[str, ...] = ()
    # A model the platform does not train, reached through LiteLLM: `anthropic/claude-sonnet-4-5`, or
    # `openai/NAME@API_BASE` for any OpenAI-compatible server. Its turns are recorded as text, never trained.
    model: str | None = None

    def __post_init__(self) -> None:
        try:
            parse_pin(self.checkpoint or "")
        except ValueError as error:  # a malformed pin fails where the environment is defined
            raise ValueError(f"agent {self.name!r}: checkpoint {error}") from None

    @property
    def trainable(self) -> bool:
        """Does this seat's sampling train its policy? Not when pinned to a checkpoint (a fixed one, or one
        relative to its policy's lineage: rollout.run.pins) or played by a model."""
        return self.checkpoint is None and self.model is None

    @property
    def relative_pin(self) -> RelativePin | None:
        """The self-play pin its `checkpoint` names (`latest`, `latest-K`, `sample`, `sample-N`), if any."""
        return parse_pin(self.checkpoint or "")


@dataclass(frozen=True)
class Conversation:
    """One conversation a seat's client held with the policy (a segment: turns that extend each other), as the
    environment sees it when deciding whether it trains (`Environment.trains`). A client such as Claude Code
    holds several on one seat: the task itself, rewrites of it (compaction, an edited history), and side tasks
    (a title, a summary, a sub-agent)."""

    segment_id: str
    turns: int
    model: str  # the model name the client asked for (side tasks often ask for a smaller one)
    tools: tuple[str, ...]  # the tools the client offered in its first request
    system: str  # the start of its first request's system prompt ("" without one)
    first_user: str  # the start of its first request's first user message
    last_user: str = (
        ""  # the start of its first request's last user message (a compaction request's instruction)
    )


@dataclass(frozen=True)
class SandboxSpec:
    """The sandbox an episode claims before its agents play: a kind (a pool: `shell`, or an environment's own
    `package.module:attribute`), how many of its seats (agent i takes seat i), how long an episode waits for a
    free one before it fails, and the claim's time to live (renewed while the episode plays).

    For a kind that runs agents' commands (`shell`), `limits` replaces the kind's own (rollout.sandbox.limits)
    for this environment's claims, and `network` is what those commands reach: `"none"` (the default),
    `"gateway"` (the acting seat's own gateway routes), or a list of those and `"host:port"`
    (rollout.security.isolation: never the stack's own ledger, Temporal, engine or gateway). docs/sandboxes.md
    says how."""

    kind: str
    seats: int = 1
    wait_s: float = 300.0
    ttl_s: float = 60.0
    limits: JailLimits | None = None
    network: str | tuple[str, ...] = "none"

    def __post_init__(self) -> None:
        SandboxNetwork.parse(self.network)  # a bad entry fails where the environment is defined

    @property
    def access(self) -> SandboxNetwork:
        return SandboxNetwork.parse(self.network)


# How long a call into a Task, and an agent's whole episode, may take unless its environment says otherwise.
TURN_TIMEOUT_S = 300.0
EPISODE_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Environment:
    name: str
    make_task: Callable[[TaskParameters, str], Task]
    source: TaskSource
    agents: tuple[AgentSeatSpec, ...] = (AgentSeatSpec(),)
    group_size: int = 4
    max_turns: int = 16
    sandbox: SandboxSpec | None = None
    replayable: bool = True
    description: str = ""
    eval_source: TaskSource | None = None  # held-out tasks for evals; training never draws them
    # A deterministic stand-in for the model, for `rollout env check` and tutorials: messages and tools so far
    # -> the assistant's reply. Without one, the check's model answers "ok".
    scripted_reply: Callable[[list[Message], tuple[ToolSpec, ...]], Message] | None = None
    # Which of a seat's conversations train (a side task such as a title may not): every one when None.
    trains: Callable[[Conversation], bool] | None = None
    # How long one call into its code (a Task's `start`, `respond`, `prepare`, `finish`; a task source's draw,
    # `trains`, `scripted_reply`) may take, and one agent's whole episode: past either the episode fails with
    # the reason (`TaskTimedOut`), never retried, and frees its slot. The defaults fit the shipped
    # environments (a coding task's command runs for at most 120 s).
    turn_timeout_s: float = TURN_TIMEOUT_S
    episode_timeout_s: float = EPISODE_TIMEOUT_S
    # The base model a policy samples and trains by default (`policies.NAME.model` overrides it): policy ->
    # smollm2, tiny-qwen3, a catalog model, an HF id or a local path. A policy not named here is on
    # `trainer.model`, as every policy is by default.
    policy_models: dict[str, str] = field(default_factory=dict[str, str])

    def __post_init__(self) -> None:
        names = [agent.name for agent in self.agents]
        if not names:
            raise ValueError(f"environment {self.name!r} has no agent seats")
        if len(set(names)) != len(names):
            raise ValueError(f"environment {self.name!r} names an agent twice: {names}")
        unknown = sorted(set(self.policy_models) - {agent.policy for agent in self.agents})
        if unknown:
            raise ValueError(
                f"environment {self.name!r}: policy_models names {', '.join(unknown)}, which no agent plays"
            )
        if self.group_size < 1 or self.max_turns < 1:
            raise ValueError(f"environment {self.name!r}: group_size and max_turns must be at least 1")
        if not (0 < self.turn_timeout_s <= self.episode_timeout_s):
            raise ValueError(
                f"environment {self.name!r}: turn_timeout_s and episode_timeout_s must be positive, the turn's "
                "no longer than the episode's"
            )
        for agent in self.agents:
            if agent.model is not None and agent.checkpoint is not None:
                raise ValueError(
                    f"environment {self.name!r}: agent {agent.name!r} names both a model and a checkpoint"
                )
            shared = [
                a.name for a in self.agents if a.policy == agent.policy and a.trainable != agent.trainable
            ]
            if shared and agent.model is not None:
                raise ValueError(
                    f"environment {self.name!r}: agent {agent.name!r} plays the external model {agent.model} "
                    f"under policy {agent.policy!r}, which {shared} train: give it a policy of its own"
                )
        if self.sandbox is not None and self.sandbox.seats < len(self.agents):
            raise ValueError(
                f"environment {self.name!r}: its sandbox has {self.sandbox.seats} seat(s) for {len(self.agents)} agents"
            )

    def task_source(self, selection: str = TRAIN_TASKS) -> TaskSource:
        """The tasks `selection` names: `train`, `eval` (held out) or `seed:N`; `ValueError` says why not."""
        if selection == TRAIN_TASKS:
            return self.source
        if selection == EVAL_TASKS:
            if self.eval_source is None:
                raise ValueError(
                    f"environment {self.name!r} holds out no tasks (its eval_source is None): give it one, or "
                    "evaluate it on generator tasks of a seed of their own (`seed: N` in the suite)"
                )
            return self.eval_source
        seed = selection.removeprefix("seed:")
        if seed != selection and seed.lstrip("-").isdigit():
            if not isinstance(self.source, Generator):
                raise ValueError(
                    f"environment {self.name!r} draws its tasks from a {type(self.source).__name__}, not a "
                    "Generator: it has no seeds to choose (evaluate its held-out tasks instead)"
                )
            return replace(self.source, seed=int(seed))
        raise ValueError(f"unknown task selection {selection!r}: train, eval or seed:N")

    def agent(self, name: str) -> AgentSeatSpec:
        for agent in self.agents:
            if agent.name == name:
                return agent
        raise KeyError(
            f"environment {self.name!r} has no agent {name!r} (agents: {[a.name for a in self.agents]})"
        )


def load_environment(reference: str) -> Environment:
    """The environment at `package.module:attribute` (the attribute may be a function returning one)."""
    try:
        value = import_reference(reference, "environment reference")
    except ReferenceLoadError as error:
        raise EnvironmentLoadError(str(error)) from error.__cause__
    if callable(value) and not isinstance(value, Environment):
        value = value()
    if not isinstance(value, Environment):
        raise EnvironmentLoadError(
            f"{reference} is a {type(value).__name__}, not a rollout.environment.Environment"
        )
    return value
