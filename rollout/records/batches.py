"""The record of a training batch in the ledger: `BatchAssembled` (`BatchInfo`, on
`run/{run}/batches/{policy}`), exactly the episodes a step trains on. Pure data: workflow code carries it (a
step's batch crosses the Temporal boundary), so it imports nothing but the record codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.records import Payload


@dataclass
class BatchInfo(Payload):
    """A `BatchAssembled` record: exactly the episodes (of whole groups) a step trains on, and the tied groups
    it consumed without training (refill replaced them by fresh ones)."""

    run: str
    policy: str
    step: int
    groups: list[int]
    episodes: list[str]
    trained_episodes: list[str]
    skipped_groups: int
    sampled_tokens: int  # 0: every group was skipped for having no signal, and the step trains nothing
    reward_mean: float  # over every group drawn, replaced ones included
    reward_std: float
    # Over every turn of the batch's episodes, trained or skipped: the prompt tokens sent to the engines, and
    # how many of them the engines' prefix caches held.
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # Refill: the tied groups consumed without training (each replaced by a fresh group), and the groups the
    # step drew (kept + replaced), kept (`groups`) and replaced. 0 in a batch recorded before refill.
    replaced_groups: list[int] = field(default_factory=list[int])
    groups_drawn: int = 0
    groups_kept: int = 0
    groups_replaced: int = 0
