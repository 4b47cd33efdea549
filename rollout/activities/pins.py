"""Resolving self-play pins (rollout.run.pins) for one episode: the body of the runner's `resolve_pins`
activity.

Contract:
- Each seat of the request whose `checkpoint` is a relative pin gets a `PinnedSeat`: the checkpoint it plays
  this episode, chosen from its policy's served lineage in the run (`served_lineage`: checkpoints with a
  serving target, oldest first), `sample` drawn with the episode's id as seed, with the fallback taken when
  the lineage is too short.
- A seat of this episode already opened on the ledger (a restarted episode, or the activity retried after
  the seat opened) keeps the checkpoint it was opened with, so a retried episode plays the same opponent
  even after newer checkpoints arrived. Reads only: the choice is recorded by the workflow's history, the
  seat's `SeatOpened` and the episode's `EpisodeFinished` (`pinned`).
"""

from __future__ import annotations

from rollout.ledger import Ledger
from rollout.ledger.queries import pinned_checkpoint_opened, served_lineage
from rollout.workflows.episode_types import PinnedSeat, PinRequest
from rollout.workflows.names import run_policy


async def resolve_pins(ledger: Ledger, request: PinRequest) -> list[PinnedSeat]:
    pinned: list[PinnedSeat] = []
    for agent in request.agents:
        pin = agent.relative_pin
        if pin is None or agent.checkpoint is None:
            continue
        opened = await pinned_checkpoint_opened(ledger, request.run, request.episode, agent.name)
        if opened is not None:
            pinned.append(PinnedSeat(agent.name, agent.checkpoint, opened))
            continue
        lineage = await served_lineage(ledger, run_policy(request.run, agent.policy))
        choice = pin.choose(lineage, seed=f"{request.run}/{request.episode}/{agent.name}")
        pinned.append(PinnedSeat(agent.name, agent.checkpoint, choice.checkpoint, choice.fallback))
    return pinned
