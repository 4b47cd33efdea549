"""The signals game as an environment: `environment` (policies `speaker` and `listener`, a table sandbox per
episode, groups of 4 episodes on the same objects), and `two_models`, the same game with the speaker on a
base model of its own (tiny-qwen3). `uv run rollout env check signals.environment:environment`
plays it against the scripted pair (`scripted_reply`: the speaker names the target's colour and shape, the
listener picks the object with the most of those words).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import replace

from rollout.contracts import Message, ToolSpec
from rollout.environment import AgentSeatSpec, Environment, Generator, SandboxSpec, TaskParameters
from rollout.harness import End, Observation, RunContext, Task
from rollout.sandbox import SandboxClient
from signals import MAX_WORDS, objects, said

EVAL_SEED = 2_000_003  # held-out tables: training draws seed 0
POLL_S = 0.1  # how often an agent looks at the table while the other one has not played yet
_NUMBER = re.compile(r"\b([1-9])\b")
_TARGET = re.compile(r"The target is the ([a-z]+ [a-z]+)\.")
_HEARD = re.compile(r'names one of them: "([^"]*)"')
_OPTION = re.compile(r"^([1-9])\. ([a-z]+ [a-z]+)$", re.MULTILINE)


def one_table(rng: random.Random) -> TaskParameters:
    drawn = objects(rng)
    speaker, listener = drawn[:], drawn[:]
    rng.shuffle(speaker)
    rng.shuffle(listener)
    return {"target": drawn[0], "speaker": json.dumps(speaker), "listener": json.dumps(listener)}


async def _wait_for(box: SandboxClient, op: str) -> dict[str, object]:
    """The table's answer to `op` once the other agent has played (the turn's time limit bounds the wait)."""
    while True:  # the other agent plays in another process, maybe on another runner: ask the table again
        answer = await box.act({"op": op})
        if not answer.get("waiting"):
            return answer
        await asyncio.sleep(POLL_S)


class Speaker(Task):
    def __init__(self, parameters: TaskParameters) -> None:
        self.target = parameters["target"]
        self.seen = json.loads(parameters["speaker"])
        self.box: SandboxClient | None = None

    async def start(self, run: RunContext) -> Observation:
        if run.sandbox is None:
            raise RuntimeError("the speaker needs its table: the environment declares a sandbox")
        self.box = SandboxClient(run.sandbox)
        listed = ", ".join(self.seen)
        return Observation(
            f"You and your partner see the same objects: {listed}. Your partner does not know which one is the "
            f"target. The target is the {self.target}. Name it in at most {MAX_WORDS} words so that your partner "
            "picks it; answer with the words only."
        )

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        assert self.box is not None
        words = said(reply.text)
        await self.box.act({"op": "say", "words": words})
        outcome = await _wait_for(self.box, "outcome")
        await self.box.aclose()
        return End(
            f"Your partner {'picked' if outcome['reward'] else 'missed'} it.",
            reward=float(str(outcome["reward"])),
            metrics={"words": float(len(words.split()))},
        )


class Listener(Task):
    def __init__(self, parameters: TaskParameters) -> None:
        self.target = parameters["target"]
        self.seen = json.loads(parameters["listener"])
        self.box: SandboxClient | None = None

    async def start(self, run: RunContext) -> Observation:
        if run.sandbox is None:
            raise RuntimeError("the listener needs its table: the environment declares a sandbox")
        self.box = SandboxClient(run.sandbox)
        heard = await _wait_for(self.box, "hear")
        options = "\n".join(f"{i}. {thing}" for i, thing in enumerate(self.seen, start=1))
        return Observation(
            f'Your partner sees these objects too and names one of them: "{heard["words"]}". Which one is it? '
            f"Answer with its number only.\n{options}"
        )

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        assert self.box is not None
        found = _NUMBER.search(reply.text)
        index = int(found.group(1)) - 1 if found else -1
        picked = self.seen[index] if 0 <= index < len(self.seen) else None
        answer = await self.box.act({"op": "pick", "object": picked, "target": self.target})
        await self.box.aclose()
        reward = float(str(answer["reward"]))
        return End(
            "Right." if reward else "Wrong.", reward=reward, metrics={"answered": float(picked is not None)}
        )


def scripted_reply(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    """The scripted pair: the speaker says the target's colour and shape; the listener picks the listed object
    that shares the most words with what it heard."""
    text = "\n".join(m.text for m in messages)
    if (heard := _HEARD.search(text)) is not None:
        words = set(heard.group(1).split())
        options = _OPTION.findall(text)
        best = max(options, key=lambda option: len(words & set(option[1].split())), default=("1", ""))
        return Message.assistant(best[0])
    if (target := _TARGET.search(text)) is not None:
        return Message.assistant(target.group(1))
    return Message.assistant("1")


def _make_task(parameters: TaskParameters, agent: str) -> Task:
    return Speaker(parameters) if agent == "speaker" else Listener(parameters)


environment = Environment(
    name="signals",
    make_task=_make_task,
    source=Generator(one_table),
    eval_source=Generator(one_table, seed=EVAL_SEED),
    agents=(AgentSeatSpec("speaker", policy="speaker"), AgentSeatSpec("listener", policy="listener")),
    group_size=4,
    max_turns=1,
    sandbox=SandboxSpec("signals.table:table", seats=2),
    replayable=False,  # the table lives in the sandbox, outside the Tasks
    description="A referential game: a speaker names a target in a few words, a listener picks it; both win.",
    scripted_reply=scripted_reply,
)

# The same game with its two policies on two base models: the speaker on tiny-qwen3 (random weights, with
# Qwen3's own tokenizer and chat template), the listener on the run's trainer.model (SmolLM2-135M-Instruct
# under cpu-quickstart). `rollout train` starts an engine for each model; the gateway renders each seat's
# turns with its own model's template, and each policy trains on its own model.
two_models = replace(
    environment,
    name="signals-two-models",
    policy_models={"speaker": "tiny-qwen3"},
    description="The signals game with the speaker on tiny-qwen3 and the listener on the run's model.",
)
