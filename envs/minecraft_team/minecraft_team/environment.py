"""The minecraft_team environment: four agents (alex, blake, casey, drew) on sandbox seats 0-3 of one claimed
Minecraft world build a pillar together (minecraft_team.pillar). The world lives outside the Tasks, so a
retried attempt cannot replay it: `replayable=False`. `uv run rollout env check
minecraft_team.environment:environment`.
"""

from __future__ import annotations

from minecraft_team.pillar import ACTIONS, AGENTS, PillarBuilder, pillar_site
from minecraft_team.policy import scripted_reply
from rollout.environment import AgentSeatSpec, Environment, Generator, SandboxSpec
from rollout.sandbox.minecraft import BOT_NAMES

EVAL_SEED = 1_000_003  # held-out sites: training draws seed 0

environment = Environment(
    name="minecraft-team",
    make_task=lambda parameters, agent: PillarBuilder(parameters, agent),
    source=Generator(pillar_site),
    eval_source=Generator(pillar_site, seed=EVAL_SEED),
    agents=tuple(AgentSeatSpec(name.lower()) for name in BOT_NAMES[:AGENTS]),
    group_size=2,
    max_turns=ACTIONS + 2,  # the task ends itself after ACTIONS replies, with its shaped reward
    sandbox=SandboxSpec("minecraft", seats=AGENTS),
    replayable=False,  # the world lives in the sandbox, outside the Tasks: a retried attempt cannot replay it
    description="Four bots in one Minecraft world build a 4-block pillar on a gold block, one block each; "
    "each is rewarded for closing in, for its own block and for the finished pillar.",
    scripted_reply=scripted_reply,
)
