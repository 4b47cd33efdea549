"""The tools an agent drives its Minecraft bot with, and the compact text a small model reads back.

Contract:
- `MINECRAFT_TOOLS` are the agent ops of `MinecraftWorld` as `ToolSpec`s with JSON schemas: `observe`,
  `wait`, `move_to`, `look`, `dig`, `place`, `chat`.
- `action_for(name, arguments)` turns a tool call (its name and JSON arguments) into the world action; a call
  that names no tool or carries arguments that are not a JSON object raises `ValueError` saying what is wrong
  (the agent is told, and the turn goes on).
- `result_text(name, result)` renders the world's answer in one or a few short lines; an observation lists
  position, facing, the blocks standing on the flat ground within a few blocks, the other players with their
  distance, the inventory and what was said since the bot last looked.
"""

from __future__ import annotations

import json
from typing import Any

from rollout.contracts import ToolCall, ToolSpec
from rollout.harness import tool_arguments
from rollout.sandbox.world import JsonObject


def _cell(description: str, *, y: bool = True) -> dict[str, Any]:
    axes = ("x", "y", "z") if y else ("x", "z")
    return {
        "type": "object",
        "properties": {axis: {"type": "integer", "description": f"block {axis}"} for axis in axes},
        "required": list(axes),
        "description": description,
    }


def _tool(name: str, description: str, parameters: dict[str, Any]) -> ToolSpec:
    return ToolSpec(name=name, description=description, parameters=parameters)


MINECRAFT_TOOLS = (
    _tool(
        "observe",
        "See where you are, the blocks and players near you, your inventory and new chat.",
        {"type": "object", "properties": {}},
    ),
    _tool(
        "wait",
        "Wait a few seconds (at most 10) for the others, then observe.",
        {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
    ),
    _tool("move_to", "Walk to block column (x, z).", _cell("where to walk", y=False)),
    _tool("look", "Turn to face block (x, y, z) and see what it is.", _cell("what to look at")),
    _tool("dig", "Break the block at (x, y, z), within 5 blocks of you.", _cell("the block to break")),
    _tool(
        "place",
        "Place a block from your inventory at the empty cell (x, y, z), within 5 blocks of you.",
        _cell("the empty cell to fill"),
    ),
    _tool(
        "chat",
        "Say something to the other players.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
)
TOOL_NAMES = frozenset(tool.name for tool in MINECRAFT_TOOLS)


def action_for(name: str, arguments: str) -> JsonObject:
    if name not in TOOL_NAMES:
        raise ValueError(f"there is no tool {name!r}: use one of {', '.join(sorted(TOOL_NAMES))}")
    return {**tool_arguments(ToolCall(id="", name=name, arguments=arguments)), "op": name}


def _at(cell: list[float]) -> str:
    return "(" + ", ".join(f"{v:g}" for v in cell) + ")"


def observation_text(view: JsonObject) -> str:
    lines = [f"You are {view['name']} at {_at(view['position'])}, facing {view['facing']}."]
    blocks = view.get("blocks") or []
    if blocks:
        lines.append(
            "Blocks near you: " + "; ".join(f"{b['name']} {_at(b['at'])}" for b in blocks[:12]) + "."
        )
    players = view.get("players") or []
    if players:
        seen = "; ".join(f"{p['name']} {_at(p['at'])}, {p['distance']:g} away" for p in players)
        lines.append(f"Players: {seen}.")
    inventory = view.get("inventory") or []
    carried = ", ".join(f"{i['name']} x{i['count']}" for i in inventory) if inventory else "nothing"
    lines.append(f"Inventory: {carried}.")
    chat = view.get("chat") or []
    if chat:
        lines.append("Chat: " + " ".join(f"{m['from']}: {m['text']}" for m in chat))
    return "\n".join(lines)


def result_text(name: str, result: JsonObject) -> str:
    if name in ("observe", "wait"):
        return observation_text(result)
    if name == "move_to":
        where = _at(result["position"])
        return (
            f"Arrived at {where}."
            if result["arrived"]
            else f"Stopped at {where}, {result['distance']:g} short."
        )
    if name == "look":
        return f"Facing {result['facing']}: {result['block']} at {_at(result['at'])}."
    if name == "dig":
        return f"Broke {result['dug']} at {_at(result['at'])}."
    if name == "place":
        return f"Placed {result['placed']} at {_at(result['at'])}."
    if name == "chat":
        return f"You said: {result['said']}"
    return json.dumps(result)
