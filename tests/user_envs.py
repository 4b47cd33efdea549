"""Environments of a user's own, as files written into a folder of theirs (the runner imports them from
where `rollout train` ran): the texts the command-line tests write, and the eval suite they write beside."""

# A user's environment, in a folder of its own: every reply earns a reward that varies with its text, so every
# group of the tiny random model carries signal and every batch trains. Each episode claims a shell sandbox
# (which `rollout train` serves) and has it say the word.
MY_ENV = """
from rollout.contracts import Message
from rollout.environment import Environment, Generator, SandboxSpec
from rollout.harness import End, Observation, RunContext, Task
from rollout.sandbox import SandboxClient
from rollout.sandbox.hosting import sandbox_workdir


class Echo(Task):
    def __init__(self, parameters: dict[str, str]) -> None:
        self.word = parameters["word"]

    async def start(self, run: RunContext) -> Observation:
        assert run.sandbox is not None
        async with SandboxClient(run.sandbox) as box:
            said = await box.act({"command": f"echo {self.word}"})
        return Observation(f"Say {said['output'].strip()}.")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=len(set(reply.text)) / (1 + len(reply.text)))


environment = Environment(
    name="my-env",
    make_task=lambda parameters, agent: Echo(parameters),
    source=Generator(lambda rng: {"word": rng.choice(["alpha", "beta", "gamma"])}),
    group_size=4,
    max_turns=1,
    sandbox=SandboxSpec("shell#my-env", wait_s=120),
)
"""

# Imports where the command runs, not on a runner: a stand-in for a module or file only the user's shell has.
RUNNER_CANNOT_IMPORT = """
import sys

if "worker" in sys.argv:
    raise ImportError("this environment needs a file that only the user's machine has")

from my_env import environment  # noqa: E402,F401
"""


# Two policies on two base models: `asker` on the run's trainer.model, `teller` on SmolLM2 (the environment's
# default, which `policies.teller.model` would override). Every reply earns a reward that varies with its
# text, so every group carries signal for each policy and every batch trains.
TWO_MODELS = """
from rollout.contracts import Message
from rollout.environment import AgentSeatSpec, Environment, Generator
from rollout.harness import End, Observation, RunContext, Task


class Say(Task):
    def __init__(self, word: str, agent: str) -> None:
        self.word, self.agent = word, agent

    async def start(self, run: RunContext) -> Observation:
        return Observation(f"Say {self.word}, {self.agent}.")

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        return End(reward=len(set(reply.text)) / (1 + len(reply.text)))


environment = Environment(
    name="two-models",
    make_task=lambda parameters, agent: Say(parameters["word"], agent),
    source=Generator(lambda rng: {"word": rng.choice(["alpha", "beta", "gamma"])}),
    agents=(AgentSeatSpec("asker", policy="asker"), AgentSeatSpec("teller", policy="teller")),
    group_size=4,
    max_turns=1,
    policy_models={"teller": "smollm2"},
)
"""

# An eval suite of the arithmetic example: `SUITE.format(episodes=N)`.
SUITE = """
name: quick
version: 1
environments:
  - environment: arithmetic.environment:environment
    episodes: {episodes}
"""
