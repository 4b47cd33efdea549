"""π_θ's logprob of each sampled token, computed only where the loss needs one.

A step's sequences are mostly prompt: the loss reads the logprob of sampled tokens only, and the LM head over
the whole vocabulary (152k columns for Qwen3) at every other position is most of a small model's step. So:

Contract:
- `micro_batches(segments, budget, packed)` groups weighted segments for one forward pass each. Packed: laid
  end to end in one row of at most `budget` tokens (a longer segment gets a row of its own), no padding.
  Padded: rows padded to the longest, at most `budget` tokens of rows × longest.
- `Rows.build(segments, packed)` is the forward pass's input. Packed rows carry position ids that restart at
  every segment and no attention mask, from which transformers builds a block-diagonal causal mask: each
  segment sees only itself, as if alone. Only models whose layers mix positions through attention alone can be
  packed (`packable(config)`); linear-attention or state-space layers would carry state across segments.
- Rows also carry the predictions the loss needs, flattened to [N] in segment order: at each position t whose
  next token t + 1 is sampled, that token, its behaviour logprob and its advantage.
- `sampled_logprobs(model, rows)` returns π_θ's logprob of those N tokens, with gradient. The model's body
  runs once; the LM head is applied to the N hidden states only, in chunks of `CHUNK` positions with a
  logsumexp (no [B, T, V] logits, no full log-softmax). Past one chunk, each chunk is recomputed in backward,
  so the head's memory is CHUNK × V whatever N. A head that is more than a projection (soft-capped or scaled
  logits) takes the model's own forward with `logits_to_keep` instead: the same numbers, more compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from rollout.rl.batches import WeightedSegment

CHUNK = 1024
# Decoder families whose only cross-position mixing is (full or sliding-window) attention.
PACKABLE = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "smollm3", "phi3", "olmo2", "gemma"})
# Config fields that change the logits after the projection (the fast head would miss them).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def packable(config: Any) -> bool:
    return getattr(config, "model_type", None) in PACKABLE


def micro_batches(
    segments: Sequence[WeightedSegment], budget: int, *, packed: bool
) -> list[list[WeightedSegment]]:
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


@dataclass(frozen=True)
class Rows:
    input_ids_RL: torch.Tensor
    position_ids_RL: torch.Tensor | None  # packed: restarting at every segment
    attention_RL: torch.Tensor | None  # padded: 1 on tokens, 0 on padding
    row_N: torch.Tensor  # where each prediction is read: row and position t (predicting token t + 1)
    position_N: torch.Tensor
    target_N: torch.Tensor
    behaviour_N: torch.Tensor
    advantage_N: torch.Tensor

    @classmethod
    def build(cls, segments: Sequence[WeightedSegment], *, packed: bool) -> Rows:
        rows: list[list[int]] = [[]] if packed else [[] for _ in segments]
        positions: list[list[int]] = [[]]
        row_n, position_n, target_n, behaviour_n, advantage_n = [], [], [], [], []
        for index, weighted in enumerate(segments):
            s = weighted.segment
            row = 0 if packed else index
            offset = len(rows[row])
            rows[row] += s.tokens_T
            if packed:
                positions[0] += range(len(s.tokens_T))
            for t in range(1, len(s.tokens_T)):
                if s.mask_T[t]:
                    row_n.append(row)
                    position_n.append(offset + t - 1)
                    target_n.append(s.tokens_T[t])
                    behaviour_n.append(s.behaviour_logprobs_T[t])
                    advantage_n.append(weighted.advantage)
        length = max(len(r) for r in rows)
        input_ids = torch.zeros((len(rows), length), dtype=torch.long)
        attention = torch.zeros((len(rows), length), dtype=torch.long)
        for r, tokens in enumerate(rows):
            input_ids[r, : len(tokens)] = torch.tensor(tokens)
            attention[r, : len(tokens)] = 1
        return cls(
            input_ids_RL=input_ids,
            position_ids_RL=torch.tensor(positions) if packed else None,
            attention_RL=None if packed else attention,
            row_N=torch.tensor(row_n, dtype=torch.long),
            position_N=torch.tensor(position_n, dtype=torch.long),
            target_N=torch.tensor(target_n, dtype=torch.long),
            behaviour_N=torch.tensor(behaviour_n, dtype=torch.float32),
            advantage_N=torch.tensor(advantage_n, dtype=torch.float32),
        )

    def to(self, device: str) -> Rows:
        def moved(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return Rows(
            input_ids_RL=self.input_ids_RL.to(device),
            position_ids_RL=moved(self.position_ids_RL),
            attention_RL=moved(self.attention_RL),
            row_N=self.row_N.to(device),
            position_N=self.position_N.to(device),
            target_N=self.target_N.to(device),
            behaviour_N=self.behaviour_N.to(device),
            advantage_N=self.advantage_N.to(device),
        )


def sampled_logprobs(model: Any, rows: Rows) -> torch.Tensor:
    """π_θ's logprob [N] of each token `rows` predicts (see the module contract)."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a peft wrapper
    inputs: dict[str, Any] = {"input_ids": rows.input_ids_RL, "use_cache": False}
    if rows.position_ids_RL is not None:
        inputs["position_ids"] = rows.position_ids_RL
    else:
        inputs["attention_mask"] = rows.attention_RL
    head = causal.get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and not any(
        getattr(causal.config, name, None) not in (None, 1, 1.0) for name in LOGIT_TRANSFORMS
    ):
        hidden_RLH = causal.base_model(**inputs).last_hidden_state
        hidden_NH = hidden_RLH[rows.row_N, rows.position_N]
        return _head_logprobs(head.weight, head.bias, hidden_NH, rows.target_N)
    kept = torch.unique(rows.position_N)  # sorted
    logits = model(**inputs, logits_to_keep=kept).logits.float()
    picked_NV = logits[rows.row_N, torch.searchsorted(kept, rows.position_N)]
    return picked_NV.gather(-1, rows.target_N[:, None]).squeeze(-1) - torch.logsumexp(picked_NV, dim=-1)


def _head_logprobs(
    weight: torch.Tensor, bias: torch.Tensor | None, hidden_NH: torch.Tensor, target_N: torch.Tensor
) -> torch.Tensor:
    if len(target_N) <= CHUNK:
        return _chunk_logprobs(weight, bias, hidden_NH, target_N)
    parts = [
        checkpoint(_chunk_logprobs, weight, bias, hidden, target, use_reentrant=False)
        for hidden, target in zip(hidden_NH.split(CHUNK), target_N.split(CHUNK), strict=True)
    ]
    return torch.cat(parts)


def _chunk_logprobs(
    weight: torch.Tensor, bias: torch.Tensor | None, hidden_NH: torch.Tensor, target_N: torch.Tensor
) -> torch.Tensor:
    logits_NV = torch.nn.functional.linear(hidden_NH, weight, bias).float()
    return logits_NV.gather(-1, target_N[:, None]).squeeze(-1) - torch.logsumexp(logits_NV, dim=-1)
