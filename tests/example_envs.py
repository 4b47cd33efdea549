"""Environments for tests: ones that misbehave on purpose, to check how the platform copes."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path

from gridworld.environment import two_agents
from minecraft_team.environment import environment as minecraft_team
from rollout.contracts import Message, ToolSpec
from rollout.environment import AgentSeatSpec, Dataset, Environment, SandboxSpec
from rollout.harness import CommandOutcome, CommandSetup, End, Observation, RunContext, Task
from rollout.sandbox import SandboxClient
from rollout.sandbox.shell import SHELL_TOOL


class Raises(Task):
    async def start(self, run: RunContext) -> Observation:
        return Observation("say anything")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        raise RuntimeError("the environment broke on purpose")


class NotFinite(Task):
    async def start(self, run: RunContext) -> Observation:
        return Observation("say anything")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=float("nan"))


raises = Environment("raises", lambda parameters, agent: Raises(), Dataset([{}]), group_size=1)
not_finite = Environment("not-finite", lambda parameters, agent: NotFinite(), Dataset([{}]), group_size=1)
not_an_environment = 42


class BadTools(Task):
    async def start(self, run: RunContext) -> Observation:
        schema = {"type": "object", "properties": {}, "required": ["cmd"]}
        return Observation("use a tool", tools=(ToolSpec(name="run shell", parameters=schema),))

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=0.0)


bad_tools = Environment("bad-tools", lambda parameters, agent: BadTools(), Dataset([{}]), group_size=1)


# Two agents sharing one grid sandbox, one episode per group (chaos tests pin each agent to its own runner).
gridworld_pair = replace(two_agents, name="gridworld-pair", group_size=1)
# Four bots in one Minecraft world, one episode per group (each agent on its own runner).
minecraft_four = replace(minecraft_team, name="minecraft-four", group_size=1)


class ShellArithmetic(Task):
    """Writes the question into the episode's shell sandbox, asks it, and checks the sandbox kept it."""

    def __init__(self, parameters: dict[str, str]) -> None:
        self.question, self.answer = parameters["question"], parameters["answer"]

    async def start(self, run: RunContext) -> Observation:
        assert run.sandbox is not None
        async with SandboxClient(run.sandbox) as box:
            await box.act({"command": f"echo '{self.question}' > question.txt"})
        return Observation(self.question, tools=(SHELL_TOOL,))

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        assert run.sandbox is not None
        async with SandboxClient(run.sandbox) as box:
            kept = await box.act({"command": "cat question.txt"})
        right = reply.text.strip() == self.answer and kept["output"].strip() == self.question
        return End(reward=1.0 if right else 0.0, metrics={"sandbox_seat": float(run.sandbox.seat)})


shell_arithmetic = Environment(
    "shell-arithmetic",
    lambda parameters, agent: ShellArithmetic(parameters),
    Dataset([{"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 4 * 6?", "answer": "24"}]),
    group_size=2,
    max_turns=1,
    sandbox=SandboxSpec("shell#episodes-test", seats=1, wait_s=30),
    replayable=False,
)
no_sandbox = replace(
    shell_arithmetic, name="no-sandbox", sandbox=SandboxSpec("shell#nobody-serves", wait_s=1)
)


# Command seats run jailed: a script is read where it is (the jail binds it), on the project's interpreter.
EXTERNAL_AGENT = str(Path(__file__).with_name("external_agent.py"))
CONVERSING_AGENT = str(Path(__file__).with_name("conversing_agent.py"))


class ExternalArithmetic(Task):
    """Played by `tests.external_agent` (a script on the OpenAI SDK); scored on what it printed."""

    async def start(self, run: RunContext) -> Observation:
        return Observation("What is 17 + 25? Answer with the number only.")

    async def finish(self, run: RunContext, outcome: CommandOutcome) -> End:
        lines = outcome.output.strip().splitlines()
        right = outcome.exit_code == 0 and bool(lines) and lines[-1] == "42"
        return End(reward=1.0 if right else 0.0, metrics={"turns_seen": float(outcome.turns)})


external_arithmetic = Environment(
    "external-arithmetic",
    lambda parameters, agent: ExternalArithmetic(),
    Dataset([{}]),
    agents=(
        AgentSeatSpec(
            "solver",
            command=(sys.executable, EXTERNAL_AGENT, "{workdir}"),
            readable=(EXTERNAL_AGENT,),
            packages=("openai",),
        ),
    ),
    group_size=2,
)


class Conversing(Task):
    """Played by `tests.conversing_agent` (a task conversation, its compaction, a title on the side); members
    0 and 2 of a group win, so groups carry a training signal."""

    async def start(self, run: RunContext) -> Observation:
        return Observation("List the files in the current directory.")

    async def finish(self, run: RunContext, outcome: CommandOutcome) -> End:
        assert outcome.exit_code == 0 and outcome.output.strip().endswith("done"), outcome.output
        return End(reward=1.0 if run.episode[-1] in "02" else 0.0)


class JudgeAsked(Task):
    """The judge's seat: one question to the external model; its reward is never trained on."""

    async def start(self, run: RunContext) -> Observation:
        return Observation("Did the solver list the files?")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=0.0)


def conversing_judged() -> Environment:
    """A command agent (`tests.conversing_agent`) whose side task (its title) does not train, beside a judge
    answered by an external model: the OpenAI-compatible server at `$ROLLOUT_TEST_JUDGE_API_BASE` (a test
    starts one), through LiteLLM."""
    judge = f"openai/judge-model@{os.environ['ROLLOUT_TEST_JUDGE_API_BASE']}"
    return Environment(
        "conversing-judged",
        lambda parameters, agent: Conversing() if agent == "solver" else JudgeAsked(),
        Dataset([{}]),
        agents=(
            AgentSeatSpec(
                "solver",
                command=(sys.executable, CONVERSING_AGENT),
                readable=(CONVERSING_AGENT,),
                packages=("openai",),
            ),
            AgentSeatSpec("judge", policy="judge", model=judge),
        ),
        group_size=2,
        max_turns=1,
        # The title the client asks for on the side is not the task: it does not train.
        trains=lambda conversation: conversation.model != "title-model",
    )


class CodingWithACoin(Task):
    """A coding task for a command agent, its reward the task's grade plus a coin (members 0 and 2 of a group
    win 1): with a random tiny model the CLIs do the same nothing in every episode, and a group needs rewards
    that differ to train on."""

    def __init__(self, task: Task) -> None:
        self.task = task

    async def start(self, run: RunContext) -> Observation:
        return await self.task.start(run)

    async def prepare(self, run: RunContext, setup: CommandSetup) -> None:
        await self.task.prepare(run, setup)

    async def finish(self, run: RunContext, outcome: CommandOutcome) -> End:
        graded = await self.task.finish(run, outcome)
        coin = 1.0 if run.episode[-1] in "02" else 0.0
        return End(graded.content, reward=graded.reward + coin, metrics=graded.metrics)


def coding_clis() -> Environment:
    """Claude Code and Codex (the npm CLIs at `$CODING_CLAUDE` and `$CODING_CODEX`) side by side on the coding
    tasks, in a sandbox pool of the test's own (`shell#cli-train`), with a coin in the reward."""
    from coding.environment import claude_code_and_codex

    pair = claude_code_and_codex(timeout_s=240)
    return replace(
        pair,
        name="coding-clis",
        make_task=lambda parameters, agent: CodingWithACoin(pair.make_task(parameters, agent)),
        sandbox=SandboxSpec("shell#cli-train", seats=2, wait_s=120),
        group_size=2,
    )


class Coin(Task):
    """Rewards by episode: members 0 and 2 of each group win, so groups carry a training signal."""

    async def start(self, run: RunContext) -> Observation:
        return Observation("What is 1 + 1?")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=1.0 if run.episode[-1] in "02" else 0.0)


coin = Environment(
    "coin",
    lambda parameters, agent: Coin(),
    Dataset([{}]),
    group_size=4,
    max_turns=1,
    eval_source=Dataset([{}]),  # evals (every eval episode is its own group: member 0, so it wins)
)


# Self-play: `player` trains the run's policy, `rival` plays it one checkpoint behind (rollout.run.pins).
coin_selfplay = Environment(
    "coin-selfplay",
    lambda parameters, agent: Coin(),
    Dataset([{}]),
    agents=(AgentSeatSpec("player"), AgentSeatSpec("rival", checkpoint="latest-1")),
    group_size=4,
    max_turns=1,
    eval_source=Dataset([{}]),
)


def _group(run: RunContext) -> int:
    return int(run.episode[1:].partition("-")[0])  # episode ids are g{group:06d}-{member}


class OddGroupsTie(Task):
    """Even groups: members 0 and 2 win (a signal). Odd groups: every member gets 0.5 (a tie, no signal)."""

    async def start(self, run: RunContext) -> Observation:
        return Observation("What is 1 + 1?")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        if _group(run) % 2:
            return End(reward=0.5)
        return End(reward=1.0 if run.episode[-1] in "02" else 0.0)


class Tie(Task):
    """Every episode gets 0.5: no group carries a signal."""

    async def start(self, run: RunContext) -> Observation:
        return Observation("What is 1 + 1?")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=0.5)


class HangsInGroups3And4(Task):
    """A coin (members 0 and 2 win), except in groups 3 and 4, whose `respond` never returns (a buggy
    environment's hang: each ends at `turn_timeout_s`)."""

    async def start(self, run: RunContext) -> Observation:
        return Observation("What is 1 + 1?")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        if _group(run) in (3, 4):
            await asyncio.sleep(3600)
        return End(reward=1.0 if run.episode[-1] in "02" else 0.0)


odd_groups_tie = Environment(
    "odd-groups-tie", lambda parameters, agent: OddGroupsTie(), Dataset([{}]), group_size=4, max_turns=1
)
every_group_ties = Environment(
    "every-group-ties", lambda parameters, agent: Tie(), Dataset([{}]), group_size=4, max_turns=1
)
hangs_in_groups_3_and_4 = Environment(
    "hangs-in-groups-3-and-4",
    lambda parameters, agent: HangsInGroups3And4(),
    Dataset([{}]),
    group_size=2,
    max_turns=1,
    turn_timeout_s=12,
)
