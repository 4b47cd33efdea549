"""Signals: a referential game for two policies. A speaker sees a target among a few objects and names it in a
few words; a listener sees the same objects in another order and the speaker's words, and picks one. Both win
when the pick is the target: the two policies must come to agree on what words mean.

`signals.environment:environment` is the game (policies `speaker` and `listener`; the episode's table lives in
a sandbox of kind `signals.table:table`, so the two agents may play on different runners); docs/multi-agent.md
trains it."""

from __future__ import annotations

import random

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle", "star")
CANDIDATES = 3
MAX_WORDS = 3


def objects(rng: random.Random) -> list[str]:
    """`CANDIDATES` distinct objects, each sharing a colour or a shape with another, so one word rarely
    names the target alone: the first is the target."""
    while True:
        colour, shape = rng.choice(COLOURS), rng.choice(SHAPES)
        others = [f"{colour} {rng.choice(SHAPES)}", f"{rng.choice(COLOURS)} {shape}"]
        drawn = [f"{colour} {shape}", *others]
        if len(set(drawn)) == CANDIDATES:
            return drawn


def said(text: str) -> str:
    """The speaker's words as the listener hears them: lower case, letters only, the first `MAX_WORDS`."""
    words = ["".join(ch for ch in word if ch.isalpha()) for word in text.lower().split()]
    return " ".join([word for word in words if word][:MAX_WORDS])
