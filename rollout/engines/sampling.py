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
- With `reuse` (a `rollout.engines.prefix_cache.PrefixCache` and the key of the model sampling), each row
  starts from the longest prefix of its prompt the cache holds for that key (at most all but the prompt's last
  token) and prefills only the rest; a prefix several rows share beyond what the cache holds is prefilled once
  first. Each row's states (prompt and completion, less the last token drawn) go into the cache as it
  finishes. The tokens drawn and their logprobs are those a fresh batch draws (to float tolerance);
  `Sampled.cached_tokens` says how many prompt tokens came from the cache. Only for a model whose cache
  layers are all plain key/value ones (`reuse_refused` says why another's cannot be).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rollout.engines.prefix_cache import Entry, PrefixCache, States, entry
from rollout.engines.protocol import FinishReason, SampleRequest

# A prefix at least this long that several rows of a batch share is prefilled once for all of them.
SHARED_PREFIX_MIN = 16


@dataclass(frozen=True)
class Sampled:
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    cached_tokens: int = 0  # prompt tokens whose states came from the prefix cache


@dataclass(frozen=True)
class Reuse:
    """Where a batch reuses and keeps key/value states: the cache, and the key of the model sampling (its
    served name and the load that made it)."""

    cache: PrefixCache
    key: str


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


def reuse_refused(model: Any) -> str | None:
    """Why key/value states of this model cannot be kept across requests, or None when they can: every
    layer of its cache must be a plain key/value one (a sliding window forgets the start of a prefix; a
    linear-attention layer keeps one recurrent state for the whole sequence, which no shorter prefix
    shares)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    try:
        layers = DynamicCache(config=model.config).layers
    except Exception as error:  # a config transformers cannot lay a cache out for
        return f"its cache layout is unknown ({error})"
    other = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if other:
        return f"its cache has {', '.join(other)} layers, whose states a shorter prefix does not share"
    return None


def _kept(past: Any, position: int, mask_T: torch.Tensor) -> States:
    """Row `position`'s key/value states, without its padding: copies, so the batch's tensors can go."""
    valid = mask_T.nonzero().squeeze(-1)
    return tuple(
        (layer.keys[position].index_select(1, valid), layer.values[position].index_select(1, valid))
        for layer in past.layers
    )


def _start(
    prompts: list[tuple[int, ...]], hits: list[tuple[Entry | None, int]], pad_id: int, device: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """The first forward pass's inputs: each row's prompt past its cached prefix, left-padded, after the
    cached states (right-aligned, padded on the left): input ids, the attention mask over cache and input,
    position ids, and the cache (None when nothing is reused)."""
    from transformers.cache_utils import DynamicCache

    batch = len(prompts)
    suffixes = [prompt[length:] for prompt, (_, length) in zip(prompts, hits, strict=True)]
    longest = max(len(s) for s in suffixes)
    input_BT = torch.full((batch, longest), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((batch, longest), dtype=torch.long)
    for row, suffix in enumerate(suffixes):
        input_BT[row, longest - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        mask_BT[row, longest - len(suffix) :] = 1
    input_BT, mask_BT = input_BT.to(device), mask_BT.to(device)
    cached = max(length for _, length in hits)
    past = None
    if cached > 0:
        some = next(found for found, length in hits if found is not None and length > 0)
        layers = []
        for layer, (keys, values) in enumerate(some.states):
            heads, _, dim = keys.shape
            keys_BHCD = keys.new_zeros((batch, heads, cached, dim))
            values_BHCD = values.new_zeros((batch, heads, cached, values.shape[-1]))
            for row, (found, length) in enumerate(hits):
                if found is not None and length > 0:
                    keys_BHCD[row, :, cached - length :] = found.states[layer][0][:, :length]
                    values_BHCD[row, :, cached - length :] = found.states[layer][1][:, :length]
            layers.append((keys_BHCD, values_BHCD))
        past = DynamicCache(ddp_cache_data=layers)
        prior_BC = torch.zeros((batch, cached), dtype=torch.long, device=device)
        for row, (_, length) in enumerate(hits):
            prior_BC[row, cached - length :] = 1
        mask_BT = torch.cat([prior_BC, mask_BT], dim=1)
    position_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)[:, -longest:]
    return input_BT, mask_BT, position_BT, past


def _lookup(reuse: Reuse, prompt: tuple[int, ...]) -> tuple[Entry | None, int]:
    """The cached prefix a row starts from: never the whole prompt (its last token's logits start the
    sampling)."""
    found, length = reuse.cache.longest(reuse.key, prompt)
    return found, min(length, len(prompt) - 1)


def _share_prefixes(
    model: Any, prompts: list[tuple[int, ...]], reuse: Reuse, pad_id: int, device: Any
) -> None:
    """Prefill once, into the cache, each prefix that several rows share beyond what the cache holds (a
    group's siblings: one prompt, several answers)."""
    as_tensors = [torch.tensor(p, dtype=torch.long) for p in prompts]
    shared: set[tuple[int, ...]] = set()
    for i, j in itertools.combinations(range(len(prompts)), 2):
        n = min(len(prompts[i]), len(prompts[j])) - 1
        if n < SHARED_PREFIX_MIN:
            continue
        differs = (as_tensors[i][:n] != as_tensors[j][:n]).nonzero()
        n = int(differs[0, 0]) if differs.numel() else n
        if n >= SHARED_PREFIX_MIN:
            shared.add(prompts[i][:n])
    for prefix in sorted(shared, key=len, reverse=True)[: len(prompts)]:
        found, length = reuse.cache.longest(reuse.key, prefix)
        if length >= len(prefix):
            continue  # held already (or by a longer prefix prefilled a moment ago)
        hit = (found, min(length, len(prefix) - 1))
        input_BT, mask_BT, position_BT, past = _start([prefix], [hit], pad_id, device)
        out = _forward(model, input_BT, mask_BT, position_BT, past)
        reuse.cache.put(entry(reuse.key, prefix, _kept(out.past_key_values, 0, mask_BT[0])))


def _forward(
    model: Any, input_BT: torch.Tensor, mask_BT: torch.Tensor, position_BT: torch.Tensor, past: Any
) -> Any:
    """One forward pass extending `past`, with only the last position's logits (a whole prompt's would cost
    GBs with a big vocabulary)."""
    return model(
        input_ids=input_BT,
        attention_mask=mask_BT,
        position_ids=position_BT,
        past_key_values=past,
        use_cache=True,
        logits_to_keep=1,
    )


@torch.inference_mode()
def sample_batch(
    model: Any,
    requests: list[SampleRequest],
    pad_id: int,
    eos_ids: set[int],
    on_token: Callable[[int, int, float, FinishReason | None], bool] | None = None,
    on_finished: Callable[[int, Sampled], None] | None = None,
    reuse: Reuse | None = None,
) -> list[Sampled]:
    device = next(model.parameters()).device
    batch = len(requests)
    prompts = [r.prompt_ids for r in requests]
    hits: list[tuple[Entry | None, int]] = [(None, 0)] * batch
    if reuse is not None:
        _share_prefixes(model, prompts, reuse, pad_id, device)
        hits = [_lookup(reuse, prompt) for prompt in prompts]
        reuse.cache.record(sum(len(p) for p in prompts), sum(length for _, length in hits))
    cached = [length for _, length in hits]
    step_input_BT, mask_BT, position_BT, past = _start(prompts, hits, pad_id, device)
    del hits  # the cache's entries are copied into `past`; holding them here would keep evicted ones alive
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
    active = list(range(batch))  # the request of each row of the tensors: a finished one leaves them
    for _ in range(max(r.max_tokens for r in requests)):
        out = _forward(model, step_input_BT, mask_BT, position_BT, past)
        past = out.past_key_values
        logits_BV = out.logits[:, -1, :].float().cpu()
        logprobs_BV = torch.log_softmax(logits_BV, dim=-1)
        next_B = []
        finished_now: list[tuple[int, int]] = []  # (position, row) of the rows that finished this step
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
            if finish[row] is not None:
                finished_now.append((position, row))
                if on_finished is not None:
                    on_finished(
                        row,
                        Sampled(tuple(ids[row]), tuple(logprobs[row]), finish[row] or "length", cached[row]),
                    )
            next_B.append(token)
        if reuse is not None:
            for position, row in finished_now:
                # What the cache now holds for this row: its prompt and every token drawn but the last.
                seen = prompts[row] + tuple(ids[row][:-1])
                reuse.cache.put(entry(reuse.key, seen, _kept(past, position, mask_BT[position])))
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
    return [
        Sampled(tuple(ids[row]), tuple(logprobs[row]), finish[row] or "length", cached[row])
        for row in range(batch)
    ]
