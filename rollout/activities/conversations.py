"""A seat's conversations, for its environment to say which train (`Environment.trains`).

Contract: `conversations(turns)` groups a seat's recorded `SampledTurn`s by segment, in recording order, each
with the opening its first turn recorded (the model the client asked for, its tools, the start of its system
prompt, of its first user message and of its last); aborted turns are not counted. `untrained(environment,
turns)` is the segment ids the environment keeps out of training: none when it has no `trains`. A `trains`
that raises is the environment's bug: it is reported as `TaskFailed`, never guessed around.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rollout.activities.agent_loop import TaskFailed
from rollout.environment import Conversation, Environment
from rollout.ledger.payloads import RecordedTurn, SampledTurn
from rollout.run.failures import TASK_FAILED, failure_in


def conversations(turns: Sequence[RecordedTurn]) -> list[Conversation]:
    found: dict[str, Conversation] = {}
    for turn in turns:
        if not isinstance(turn, SampledTurn) or turn.aborted is not None:
            continue
        known = found.get(turn.segment_id)
        if known is None:
            opening = turn.opening or {}
            found[turn.segment_id] = Conversation(
                segment_id=turn.segment_id,
                turns=1,
                model=str(opening.get("model", "")),
                tools=tuple(str(t) for t in opening.get("tools") or ()),
                system=str(opening.get("system", "")),
                first_user=str(opening.get("first_user", "")),
                last_user=str(opening.get("last_user", "")),
            )
        else:
            found[turn.segment_id] = replace(known, turns=known.turns + 1)
    return list(found.values())


def _package(environment: Environment) -> str:
    return getattr(environment.trains, "__module__", None) or ""


def untrained(environment: Environment, turns: Sequence[RecordedTurn]) -> list[str]:
    if environment.trains is None:
        return []
    kept_out = []
    for conversation in conversations(turns):
        try:
            trains = environment.trains(conversation)
        except Exception as error:
            raise TaskFailed(
                failure_in(error, TASK_FAILED, f"trains({conversation.segment_id})", _package(environment))
            ) from error
        if not trains:
            kept_out.append(conversation.segment_id)
    return kept_out
