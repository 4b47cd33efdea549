"""Batched autoregressive sampling with a Hugging Face causal LM: pure compute, no I/O.

Contract:
- `sample_batch` runs several requests in one forward pass per step (left-padded, with a KV cache) and
  returns, per request, the sampled ids and the log-probability of each under the model's raw distribution
  (temperature 1), which is the behaviour logprob training needs.
- Each request keeps its own temperature, top_p, stop ids, token budget and seed: a seeded request draws the
  same tokens whatever else shares its batch.
- Temperature 0 (or one so small that the scaled logits overflow) and top_p 0 mean greedy.
- `on_token(row, token, logprob, finish)`, when given, hears every token as it is drawn (with the row's finish
  reason on its last); answering False stops that row there (its client went away), the others go on.
- A finished row leaves the batch (its rows of the KV cache are dropped, when every layer of the model's cache
  is a plain key/value one; a hybrid model's finished rows stay, padded), so the rest stop paying for it;
  `on_finished(row, sampled)`, when given, hears each request's result the step it finishes, not when the
  longest row does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rollout.engines.protocol import FinishReason, SampleRequest


@dataclass(frozen=True)
class Sampled:
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason


def _pick(logits_V: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    scaled_V = logits_V / temperature if temperature > 0 else None
    # A temperature so small that the logits overflow is greedy too (softmax of inf is NaN).
    if scaled_V is None or not bool(torch.isfinite(scaled_V).all()):
        return int(torch.argmax(logits_V).item())
    probs_V = torch.softmax(scaled_V, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs_V, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
        keep[0] = True  # the top token always stays: top_p 0 is greedy
        probs_V = torch.zeros_like(probs_V).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs_V, 1, generator=generator).item())


def _rows_can_leave(past: Any) -> bool:
    """Whether rows can be dropped from this KV cache: only when every layer is a plain key/value one. A
    linear-attention layer (Qwen3.5's) keeps a recurrent state per row that `batch_select_indices` would not
    cut down with the keys and values, or cannot select at all."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(past, "layers", None)
    return (
        isinstance(past, DynamicCache)
        and bool(layers)
        and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)
    )


@torch.inference_mode()
def sample_batch(
    model: Any,
    requests: list[SampleRequest],
    pad_id: int,
    eos_ids: set[int],
    on_token: Callable[[int, int, float, FinishReason | None], bool] | None = None,
    on_finished: Callable[[int, Sampled], None] | None = None,
) -> list[Sampled]:
    device = next(model.parameters()).device
    batch = len(requests)
    longest = max(len(r.prompt_ids) for r in requests)
    input_BT = torch.full((batch, longest), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((batch, longest), dtype=torch.long)
    for row, request in enumerate(requests):
        n = len(request.prompt_ids)
        input_BT[row, longest - n :] = torch.tensor(request.prompt_ids, dtype=torch.long)
        mask_BT[row, longest - n :] = 1
    input_BT, mask_BT = input_BT.to(device), mask_BT.to(device)
    generators = []
    for request in requests:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(
            request.seed if request.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        )
        generators.append(generator)

    ids: list[list[int]] = [[] for _ in requests]
    logprobs: list[list[float]] = [[] for _ in requests]
    finish: list[FinishReason | None] = [None] * batch
    stops = [set(r.stop_token_ids) | eos_ids for r in requests]
    past: Any = None
    step_input_BT = input_BT
    position_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
    active = list(range(batch))  # the request of each row of the tensors: a finished one leaves them
    for _ in range(max(r.max_tokens for r in requests)):
        out = model(
            input_ids=step_input_BT,
            attention_mask=mask_BT,
            position_ids=position_BT,
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,  # only the last position samples: a whole prompt's logits cost GBs with a big vocab
        )
        past = out.past_key_values
        logits_BV = out.logits[:, -1, :].float().cpu()
        logprobs_BV = torch.log_softmax(logits_BV, dim=-1)
        next_B = []
        for position, row in enumerate(active):
            request = requests[row]
            if finish[row] is not None:  # a cache that cannot drop rows keeps a finished one, padded
                next_B.append(pad_id)
                continue
            token = _pick(logits_BV[position], request.temperature, request.top_p, generators[row])
            ids[row].append(token)
            logprobs[row].append(float(logprobs_BV[position, token]))
            if token in stops[row]:
                finish[row] = "stop"
            elif len(ids[row]) >= request.max_tokens:
                finish[row] = "length"
            if on_token is not None and not on_token(row, token, logprobs[row][-1], finish[row]):
                finish[row] = finish[row] or "length"
            if finish[row] is not None and on_finished is not None:
                on_finished(row, Sampled(tuple(ids[row]), tuple(logprobs[row]), finish[row] or "length"))
            next_B.append(token)
        going = [position for position, row in enumerate(active) if finish[row] is None]
        if not going:
            break
        step_input_BT = torch.tensor(next_B, dtype=torch.long, device=device).unsqueeze(1)
        if len(going) < len(active) and _rows_can_leave(past):
            # Finished rows leave the batch: the rest no longer pay for their forward passes.
            kept = torch.tensor(going, dtype=torch.long, device=device)
            past.batch_select_indices(kept)
            step_input_BT, mask_BT, position_BT = (
                t.index_select(0, kept) for t in (step_input_BT, mask_BT, position_BT)
            )
            active = [active[position] for position in going]
        mask_BT = torch.cat([mask_BT, torch.ones((len(active), 1), dtype=torch.long, device=device)], dim=1)
        position_BT = position_BT[:, -1:] + 1
    return [Sampled(tuple(ids[row]), tuple(logprobs[row]), finish[row] or "length") for row in range(batch)]
