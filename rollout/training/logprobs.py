"""π_θ's logprob of each sampled token, computed only where the loss needs one.

A step's sequences are mostly prompt: the loss reads the logprob of sampled tokens only, and the LM head over
the whole vocabulary (152k columns for Qwen3) at every other position is most of a small model's step. So:

Contract:
- `layout_for(config)` picks how a micro-batch's segments share one forward pass, and says why when it is
  not a tree:
  - tree: the segments as a prefix tree in one row (rollout.training.prefix_tree): a prefix several segments
    share (a group's prompt, a conversation's opening) is computed once, each continuation attending to it
    through an ancestor mask, at its own positions. For models whose only mixing across positions is full
    causal attention.
  - packed: end to end in one row, position ids restarting at every segment and no attention mask, from which
    transformers builds a block-diagonal causal mask: each segment whole, as if alone. For attention models
    with a sliding window (an ancestor mask would bypass the window).
  - padded: a row per segment, padded. For models whose linear-attention or state-space layers would carry
    state across segments.
- `micro_batches(segments, budget, layout)` groups weighted segments for one forward pass each, counting the
  tokens the pass computes: a tree counts each shared prefix once (its segments sorted by their ids, so those
  that share a prefix meet in one micro-batch); packed, the sum of the lengths; padded, rows × the longest. A
  segment costing more than `budget` alone gets a pass of its own.
- `Rows.build(segments, layout)` is the forward pass's input; `computed_tokens` is what the pass computes.
- Rows also carry the predictions the loss needs, flattened to [N] in segment order: at each position t whose
  next token t + 1 is sampled, that token, its behaviour logprob and its advantage.
- `sampled_logprobs(model, rows)` returns π_θ's logprob of those N tokens, with gradient, and the entropy of
  π_θ's whole next-token distribution at each of those positions (no gradient: a diagnostic). The model's body
  runs once; the LM head is applied to the N hidden states only, in chunks of `CHUNK` positions with a
  logsumexp (no [B, T, V] logits, no full log-softmax). Past one chunk, each chunk is recomputed in backward,
  so the head's memory is CHUNK × V whatever N. A head that is more than a projection (soft-capped or scaled
  logits) takes the model's own forward with `logits_to_keep` instead: the same numbers, more compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from rollout.rl.batches import WeightedSegment
from rollout.training.prefix_tree import PrefixForest

CHUNK = 1024
# Decoder families whose only cross-position mixing is (full or sliding-window) attention.
PACKABLE = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "smollm3", "phi3", "olmo2", "gemma"})
# Config fields that change the logits after the projection (the fast head would miss them).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class Layout(StrEnum):
    tree = "tree"
    packed = "packed"
    padded = "padded"


def layout_for(config: Any) -> tuple[Layout, str | None]:
    """The layout a model's forward pass takes, and why it is not a tree (None when it is)."""
    kind = getattr(config, "model_type", None)
    if kind not in PACKABLE:
        return Layout.padded, (
            f"{kind} layers mix positions outside attention (linear attention or a state space), so segments "
            "cannot share a forward pass: each is computed whole in a padded row, its prefix included"
        )
    if _slides(config):
        return Layout.packed, (
            f"{kind} attends through a sliding window, which a shared-prefix mask would bypass: segments are "
            "packed end to end, each computing its whole prefix"
        )
    return Layout.tree, None


def _slides(config: Any) -> bool:
    types = getattr(config, "layer_types", None)
    if types:
        return any(kind != "full_attention" for kind in types)
    return getattr(config, "sliding_window", None) is not None and bool(
        getattr(config, "use_sliding_window", True)
    )


def micro_batches(
    segments: Sequence[WeightedSegment], budget: int, *, layout: Layout
) -> list[list[WeightedSegment]]:
    if layout is Layout.tree:
        return _tree_batches(segments, budget)
    packed = layout is Layout.packed
    batches: list[list[WeightedSegment]] = []
    current: list[WeightedSegment] = []
    longest = used = 0
    for weighted in segments:
        length = len(weighted.segment.tokens_T)
        # A packed row costs the sum of its lengths; a padded micro-batch (its longest) × (its rows).
        cost = used + length if packed else max(longest, length) * (len(current) + 1)
        if current and cost > budget:
            batches.append(current)
            current, longest, used = [], 0, 0
        current.append(weighted)
        longest, used = max(longest, length), used + length
    if current:
        batches.append(current)
    return batches


def _tree_batches(segments: Sequence[WeightedSegment], budget: int) -> list[list[WeightedSegment]]:
    # Sorted by their ids, segments that share a prefix are neighbours, so they land in one tree.
    ordered = sorted(segments, key=lambda weighted: weighted.segment.tokens_T)
    batches: list[list[WeightedSegment]] = []
    current: list[WeightedSegment] = []
    forest = PrefixForest()
    for weighted in ordered:
        tokens = weighted.segment.tokens_T
        if current and len(forest) + forest.cost(tokens) > budget:
            batches.append(current)
            current, forest = [], PrefixForest()
        forest.add(tokens)
        current.append(weighted)
    if current:
        batches.append(current)
    return batches


@dataclass(frozen=True)
class Rows:
    input_ids_RL: torch.Tensor
    position_ids_RL: torch.Tensor | None  # packed: restarting at every segment; tree: each node's depth
    attention_RL: torch.Tensor | None  # padded: 1 on tokens, 0 on padding
    visible_LL: torch.Tensor | None  # tree: True where query i may attend to key j (j is i or its ancestor)
    row_N: torch.Tensor  # where each prediction is read: row and position t (predicting token t + 1)
    position_N: torch.Tensor
    target_N: torch.Tensor
    behaviour_N: torch.Tensor
    advantage_N: torch.Tensor

    @property
    def computed_tokens(self) -> int:
        """Tokens the forward pass computes (padding included)."""
        return self.input_ids_RL.numel()

    @classmethod
    def build(cls, segments: Sequence[WeightedSegment], *, layout: Layout) -> Rows:
        if layout is Layout.tree:
            return cls._tree(segments)
        packed = layout is Layout.packed
        rows: list[list[int]] = [[]] if packed else [[] for _ in segments]
        positions: list[list[int]] = [[]]
        predictions = _Predictions()
        for index, weighted in enumerate(segments):
            s = weighted.segment
            row = 0 if packed else index
            offset = len(rows[row])
            rows[row] += s.tokens_T
            if packed:
                positions[0] += range(len(s.tokens_T))
            predictions.add(weighted, row, range(offset, offset + len(s.tokens_T)))
        length = max(len(r) for r in rows)
        input_ids = torch.zeros((len(rows), length), dtype=torch.long)
        attention = torch.zeros((len(rows), length), dtype=torch.long)
        for r, tokens in enumerate(rows):
            input_ids[r, : len(tokens)] = torch.tensor(tokens)
            attention[r, : len(tokens)] = 1
        return predictions.rows(
            input_ids,
            position_ids=torch.tensor(positions) if packed else None,
            attention=None if packed else attention,
        )

    @classmethod
    def _tree(cls, segments: Sequence[WeightedSegment]) -> Rows:
        forest = PrefixForest()
        predictions = _Predictions()
        for weighted in segments:
            predictions.add(weighted, 0, forest.add(weighted.segment.tokens_T))
        return predictions.rows(
            torch.tensor([forest.tokens]),
            position_ids=torch.tensor([forest.positions]),
            visible=forest.visible(),
        )

    def to(self, device: str) -> Rows:
        def moved(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return Rows(
            input_ids_RL=self.input_ids_RL.to(device),
            position_ids_RL=moved(self.position_ids_RL),
            attention_RL=moved(self.attention_RL),
            visible_LL=moved(self.visible_LL),
            row_N=self.row_N.to(device),
            position_N=self.position_N.to(device),
            target_N=self.target_N.to(device),
            behaviour_N=self.behaviour_N.to(device),
            advantage_N=self.advantage_N.to(device),
        )


class _Predictions:
    """The [N] predictions of the segments, in segment order, as they are laid out."""

    def __init__(self) -> None:
        self.row: list[int] = []
        self.position: list[int] = []
        self.target: list[int] = []
        self.behaviour: list[float] = []
        self.advantage: list[float] = []

    def add(self, weighted: WeightedSegment, row: int, places: Sequence[int]) -> None:
        """`places[t]`: where the segment's token t sits in `row`; position t predicts token t + 1."""
        s = weighted.segment
        for t in range(1, len(s.tokens_T)):
            if s.mask_T[t]:
                self.row.append(row)
                self.position.append(places[t - 1])
                self.target.append(s.tokens_T[t])
                self.behaviour.append(s.behaviour_logprobs_T[t])
                self.advantage.append(weighted.advantage)

    def rows(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor | None,
        attention: torch.Tensor | None = None,
        visible: torch.Tensor | None = None,
    ) -> Rows:
        return Rows(
            input_ids_RL=input_ids,
            position_ids_RL=position_ids,
            attention_RL=attention,
            visible_LL=visible,
            row_N=torch.tensor(self.row, dtype=torch.long),
            position_N=torch.tensor(self.position, dtype=torch.long),
            target_N=torch.tensor(self.target, dtype=torch.long),
            behaviour_N=torch.tensor(self.behaviour, dtype=torch.float32),
            advantage_N=torch.tensor(self.advantage, dtype=torch.float32),
        )


@dataclass(frozen=True)
class TokenScores:
    """π_θ at each of the N predicted positions: the sampled token's logprob (with gradient) and the entropy
    of the next-token distribution, in nats (detached)."""

    logprobs_N: torch.Tensor
    entropy_N: torch.Tensor


def sampled_logprobs(model: Any, rows: Rows) -> TokenScores:
    """π_θ's logprob [N] of each token `rows` predicts, and its entropy there (see the module contract)."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a peft wrapper
    inputs: dict[str, Any] = {"input_ids": rows.input_ids_RL, "use_cache": False}
    if rows.position_ids_RL is not None:
        inputs["position_ids"] = rows.position_ids_RL
    if rows.visible_LL is not None:
        inputs["attention_mask"] = _additive(rows.visible_LL, causal.get_input_embeddings().weight.dtype)
    elif rows.attention_RL is not None:
        inputs["attention_mask"] = rows.attention_RL
    head = causal.get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and not any(
        getattr(causal.config, name, None) not in (None, 1, 1.0) for name in LOGIT_TRANSFORMS
    ):
        hidden_RLH = causal.base_model(**inputs).last_hidden_state
        hidden_NH = hidden_RLH[rows.row_N, rows.position_N]
        return _head_scores(head.weight, head.bias, hidden_NH, rows.target_N)
    kept = torch.unique(rows.position_N)  # sorted
    logits = model(**inputs, logits_to_keep=kept).logits.float()
    picked_NV = logits[rows.row_N, torch.searchsorted(kept, rows.position_N)]
    logprobs_N = picked_NV.gather(-1, rows.target_N[:, None]).squeeze(-1) - torch.logsumexp(picked_NV, dim=-1)
    return TokenScores(logprobs_N, torch.cat([_entropy(chunk) for chunk in picked_NV.split(CHUNK)]))


def _additive(visible_LL: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ancestor mask as every attention implementation takes a custom one: [1, 1, L, L], 0 where a query
    may attend and the dtype's lowest value where it may not (eager attention adds it to the scores)."""
    blocked = torch.zeros(visible_LL.shape, dtype=dtype, device=visible_LL.device)
    return blocked.masked_fill_(~visible_LL, torch.finfo(dtype).min)[None, None]


def _head_scores(
    weight: torch.Tensor, bias: torch.Tensor | None, hidden_NH: torch.Tensor, target_N: torch.Tensor
) -> TokenScores:
    if len(target_N) <= CHUNK:
        return TokenScores(*_chunk_scores(weight, bias, hidden_NH, target_N))
    parts = [
        checkpoint(_chunk_scores, weight, bias, hidden, target, use_reentrant=False)
        for hidden, target in zip(hidden_NH.split(CHUNK), target_N.split(CHUNK), strict=True)
    ]
    return TokenScores(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))


def _chunk_scores(
    weight: torch.Tensor, bias: torch.Tensor | None, hidden_NH: torch.Tensor, target_N: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The targets' logprobs (with gradient) and the entropies (without) of one chunk of positions."""
    logits_NV = torch.nn.functional.linear(hidden_NH, weight, bias).float()
    logprobs_N = logits_NV.gather(-1, target_N[:, None]).squeeze(-1) - torch.logsumexp(logits_NV, dim=-1)
    return logprobs_N, _entropy(logits_NV)


def _entropy(logits_NV: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) − Σ softmax(z)·z per row, without gradient and with one buffer of the logits' size (a
    −inf logit's term is 0, not NaN)."""
    with torch.no_grad():
        weighted_NV = torch.softmax(logits_NV, dim=-1).mul_(logits_NV).nan_to_num_(nan=0.0)
        return (torch.logsumexp(logits_NV, dim=-1) - weighted_NV.sum(-1)).clamp_min_(0.0)
