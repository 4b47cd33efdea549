"""minecraft_team: four agents, each on its own machine, drive four bots in one Minecraft world (a sandbox of
the built-in `minecraft` kind, leased by claim) and build a pillar together.

`minecraft_team.environment:environment` is the environment; `minecraft_team.pillar` the task;
`minecraft_team.policy` a scripted player that solves it (env check and tests play it). See docs/minecraft.md.
"""
