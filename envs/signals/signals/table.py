"""The table two agents of one episode share: a sandbox kind (`signals.table:table`), so the speaker and the
listener may play on different runners. Seat 0 is the speaker, seat 1 the listener.

World actions: `{"op": "say", "words"}` (the speaker, once per claim), `{"op": "hear"}` (the listener: the
words, or `waiting`), `{"op": "pick", "object", "target"}` (the listener, once: its pick and the target; it
answers the reward), `{"op": "outcome"}` (either: the reward once the listener picked, or `waiting`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Table:
    def __init__(self, workdir: Path, seats: int) -> None:
        self.seats = seats
        self.words: str | None = None
        self.reward: float | None = None

    async def reset(self) -> None:
        self.words, self.reward = None, None

    async def act(self, seat: int, action: dict[str, Any]) -> dict[str, Any]:
        op = action.get("op")
        if op == "say":
            if seat != 0:
                raise ValueError("only the speaker (seat 0) says")
            if self.words is None:  # a retried act says nothing new: the first words stand
                self.words = str(action.get("words", ""))[:200]
            return {"words": self.words}
        if op == "hear":
            return {"waiting": True} if self.words is None else {"words": self.words}
        if op == "pick":
            if seat != 1:
                raise ValueError("only the listener (seat 1) picks")
            if self.words is None:
                raise ValueError("nothing was said yet: hear first")
            if self.reward is None:
                self.reward = 1.0 if action.get("object") == action.get("target") else 0.0
            return {"reward": self.reward}
        if op == "outcome":
            return {"waiting": True} if self.reward is None else {"reward": self.reward}
        raise ValueError(f"op must be say, hear, pick or outcome, not {op!r}")

    async def close(self) -> None:
        return None


def table(workdir: Path, seats: int) -> Table:
    """The sandbox kind `signals.table:table`."""
    return Table(workdir, seats)
