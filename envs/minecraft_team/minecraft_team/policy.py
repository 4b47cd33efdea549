"""The scripted pillar builder: reads the goal and the latest position from the conversation's text, walks to
a spot beside the gold block (one side per builder, so they do not stand in each other's way), places its
block on top of the pillar, then waits for the others until the pillar is done. It works on a rendered prompt
too, so the scripted engine can play it through the gateway (`minecraft_team.policy:reply_to_prompt`).
"""

from __future__ import annotations

import json
import re

from rollout.contracts import Message, ToolCall, ToolSpec
from rollout.sandbox.minecraft import BOT_NAMES

_NAME = re.compile(r"You are (\w+), one of four builders")
_GOLD = re.compile(r"on the gold block at \((-?\d+), (-?\d+), (-?\d+)\)")
_POSITION = re.compile(r"(?:You are \w+ at|Arrived at|Stopped at) \((-?[\d.]+), (-?[\d.]+), (-?[\d.]+)\)")
_HEIGHT = re.compile(r"The pillar is (\d+) of")
SIDES = ((2, 0), (-2, 0), (0, 2), (0, -2))  # where each builder stands, beside the gold block


def _call(text: str, name: str, arguments: dict[str, int | str]) -> Message:
    call = ToolCall(id=f"call_{text.count('The pillar is')}", name=name, arguments=json.dumps(arguments))
    return Message.assistant("", tool_calls=(call,))


def reply_to_prompt(text: str) -> Message:
    """The next action for the conversation so far (text of every message, or a rendered prompt)."""
    names, golds, positions = _NAME.findall(text), _GOLD.findall(text), _POSITION.findall(text)
    if not names or not golds or not positions:
        return Message.assistant("I cannot tell where I am.")
    me = names[-1]
    x, y, z = (int(v) for v in golds[-1])
    heights = _HEIGHT.findall(text)
    height = int(heights[-1]) if heights else 0
    if "Placed " in text:
        return _call(text, "wait", {"seconds": 5})
    side = SIDES[BOT_NAMES.index(me) % len(SIDES)] if me in BOT_NAMES else SIDES[0]
    spot = (x + side[0], z + side[1])
    px, _, pz = (float(v) for v in positions[-1])
    if abs(px - (spot[0] + 0.5)) > 1 or abs(pz - (spot[1] + 0.5)) > 1:
        return _call(text, "move_to", {"x": spot[0], "z": spot[1]})
    return _call(text, "place", {"x": x, "y": y + height + 1, "z": z})


def scripted_reply(messages: list[Message], tools: tuple[ToolSpec, ...]) -> Message:
    return reply_to_prompt("\n".join(m.text for m in messages))
