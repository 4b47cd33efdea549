"""Training sequences from recorded turns: one per segment, with the loss mask on sampled tokens. Pure.

A seat's `TurnRecorded`s (`rollout.ledger.payloads.SampledTurn`, written by the gateway) carry, per turn, the
segment it extends, how many of the segment's ids its prompt reuses (`prompt_prefix_len`), the new prompt ids,
the sampled ids with one behaviour logprob each, and the version of the checkpoint that sampled them.

Contract:
- Turns are applied in recording order. A turn keeps the first `prompt_prefix_len` ids of its segment, appends
  its new prompt ids (mask 0) and its sampled ids (mask 1, with their logprobs and checkpoint version). Ids a
  later turn did not keep were never seen again by the model and are not trained on.
- Aborted turns are skipped (turns of external models, text only with no ids, are not `SampledTurn`s).
- Every token of a segment has its own behaviour logprob and sampling version, so the loss corrects each
  token against the checkpoint that sampled it, including early turns that waited through training steps.
- Non-sampled positions hold logprob 0.0 and version -1.
- A segment counts its turns' prompt tokens and how many of them the engine took from its prefix cache
  (`prompt_tokens`, `cached_tokens`: every turn applied, kept later or not), for the batch's hit rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rollout.ledger.payloads import SampledTurn


@dataclass(frozen=True)
class TrainingSegment:
    segment_id: str
    seat: str
    tokens_T: tuple[int, ...]
    mask_T: tuple[int, ...]
    behaviour_logprobs_T: tuple[float, ...]
    versions_T: tuple[int, ...]
    prompt_tokens: int = 0  # over its turns: the prompts the engine was sent
    cached_tokens: int = 0  # of those, the ones its prefix cache held

    @property
    def sampled_tokens(self) -> int:
        return sum(self.mask_T)

    @property
    def sampled_versions(self) -> list[int]:
        return [v for v, m in zip(self.versions_T, self.mask_T, strict=True) if m]


class _Building:
    def __init__(self, segment_id: str, seat: str) -> None:
        self.segment_id, self.seat = segment_id, seat
        self.tokens: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.prompt_tokens = self.cached_tokens = 0

    def apply(self, turn: SampledTurn) -> None:
        keep = turn.prompt_prefix_len
        if keep > len(self.tokens):
            raise ValueError(
                f"turn {turn.turn_index} of segment {self.segment_id} reuses {keep} ids, but the segment has "
                f"{len(self.tokens)}: turns must be applied in recording order"
            )
        for column in (self.tokens, self.mask, self.logprobs, self.versions):
            del column[keep:]
        delta = list(turn.prompt_ids_delta)
        completion = list(turn.completion_ids)
        logprobs = list(turn.completion_logprobs)
        if len(logprobs) != len(completion):
            raise ValueError(
                f"segment {self.segment_id}: a turn has {len(completion)} ids but {len(logprobs)} logprobs"
            )
        version = turn.checkpoint_version
        self.prompt_tokens += keep + len(delta)
        self.cached_tokens += turn.cached_tokens
        self.tokens += delta + completion
        self.mask += [0] * len(delta) + [1] * len(completion)
        self.logprobs += [0.0] * len(delta) + logprobs
        self.versions += [-1] * len(delta) + [version] * len(completion)

    def done(self) -> TrainingSegment:
        return TrainingSegment(
            segment_id=self.segment_id,
            seat=self.seat,
            tokens_T=tuple(self.tokens),
            mask_T=tuple(self.mask),
            behaviour_logprobs_T=tuple(self.logprobs),
            versions_T=tuple(self.versions),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
        )


def segments_from_turns(turns: Iterable[SampledTurn]) -> list[TrainingSegment]:
    """The training segments of a seat's turns (in recording order), in order of first appearance."""
    building: dict[str, _Building] = {}
    for turn in turns:
        if turn.aborted:
            continue
        if turn.segment_id not in building:
            building[turn.segment_id] = _Building(turn.segment_id, turn.seat)
        building[turn.segment_id].apply(turn)
    return [b.done() for b in building.values()]
