"""`treetrain`: what computing each shared prefix once saves the local trainer.

SmolLM2-135M-Instruct, LoRA r=8 on q/k/v/o, fp32 on the CPU (bf16 on CUDA where there is one), PPO, the
default `micro_batch_tokens` (4096). Each case is one training batch, stepped in a process of its own per
side, so peak memory is the side's own:
- `group`: `GROUPS` groups of 8 answers (`ANSWER_TOKENS` tokens each) to a `PROMPT_TOKENS`-token prompt.
- `coding`: multi-turn segments of the coding environment's tasks: `EPISODES` episodes of each of `TASKS`
  tasks, each a conversation rendered in SmolLM2's chat format (the task's real instruction, `cat` calls whose
  results are the repository's real files), its answers sampled; every episode is cut in two segments by a
  compaction that keeps the opening and the first exchange. Episodes of a task share the opening; the two
  segments of an episode share that and its first exchange.
Sides: `shared` (the trainer's prefix tree) against `unshared` (the same segments packed end to end, each
with its whole prefix: the trainer before). Reported per side: seconds per step (the mean of `STEPS` steps
after one warm-up step), the tokens the forward passes computed, and the step's peak memory (CUDA: the
allocator's peak; CPU: the process's peak resident memory above what it held before the first step). Goal:
the group case ≥ 2.5× faster shared. The last line printed is one JSON object with every number.
`--quick` checks that it works: the tiny random Qwen3 model, smaller cases, one step.
"""

from __future__ import annotations

import json
import multiprocessing
import platform
import random
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

PROMPT_TOKENS = 1000
ANSWER_TOKENS = 100
GROUPS = 1
TASKS = 1
EPISODES = 4
TURNS = 4
RESULT_CHARS = 800  # of each file a `cat` shows
STEPS = 2
SIDES = ("shared", "unshared")


def _segment(name: str, pieces: list[tuple[list[int], bool]], rng: random.Random) -> Any:
    """A training segment from (ids, sampled?) pieces, with behaviour logprobs a sampler might have given."""
    from rollout.rl.segments import TrainingSegment

    tokens = [token for ids, _ in pieces for token in ids]
    mask = [int(sampled) for ids, sampled in pieces for _ in ids]
    mask[0] = 0
    return TrainingSegment(
        segment_id=name,
        seat="seat",
        tokens_T=tuple(tokens),
        mask_T=tuple(mask),
        behaviour_logprobs_T=tuple(-rng.uniform(0.5, 3.0) if m else 0.0 for m in mask),
        versions_T=(0,) * len(tokens),
    )


def _group_segments(quick: bool) -> list[Any]:
    from rollout.rl.batches import WeightedSegment

    rng = random.Random(0)
    prompt_tokens, answer_tokens = (200, 20) if quick else (PROMPT_TOKENS, ANSWER_TOKENS)
    weighted = []
    for group in range(GROUPS):
        prompt = [rng.randrange(100, 49_000) for _ in range(prompt_tokens)]
        for n in range(8):
            answer = [rng.randrange(100, 49_000) for _ in range(answer_tokens)]
            segment = _segment(f"g{group}a{n}", [(prompt, False), (answer, True)], rng)
            weighted.append(WeightedSegment(f"g{group}e{n}", "solver", rng.uniform(-1, 1), segment))
    return weighted


def _coding_segments(tokenizer: Any, quick: bool) -> list[Any]:
    from coding.tasks import training_tasks
    from rollout.rl.batches import WeightedSegment

    def said(role: str, text: str) -> list[int]:
        return tokenizer.encode(f"<|im_start|>{role}\n{text}<|im_end|>\n", add_special_tokens=False)

    rng = random.Random(1)
    weighted = []
    for task in training_tasks()[: 1 if quick else TASKS]:
        files = sorted(task.files)
        opening = said("system", "You are a careful software engineer with a shell tool.") + said(
            "user", f"{task.instruction}\n\nThe repository's files: {', '.join(files)}."
        )
        for episode in range(2 if quick else EPISODES):
            exchanges = []
            for turn in range(3 if quick else TURNS):
                path = rng.choice(files)
                call = json.dumps({"command": f"cat {path}", "turn": turn, "episode": episode})
                result = task.files[path][:RESULT_CHARS]
                exchanges.append(((said("assistant", call), True), (said("tool", result), False)))
            first, *rest = exchanges
            cut = len(rest) // 2
            summary = said("user", f"Summary so far: you read {len(exchanges)} files of {task.id}.")
            before = [(opening, False), *first, *(p for exchange in rest[:cut] for p in exchange)]
            after = [(opening, False), *first, (summary, False), *(p for x in rest[cut:] for p in x)]
            advantage = rng.uniform(-1, 1)
            for part, pieces in (("before", before), ("after", after)):
                segment = _segment(f"{task.id}/{episode}/{part}", pieces, rng)
                weighted.append(WeightedSegment(f"{task.id}/{episode}", "coder", advantage, segment))
    return weighted


def _measure(case: str, side: str, quick: bool) -> dict[str, Any]:
    """One side of one case, in this (fresh) process."""
    import psutil
    import torch
    from transformers import AutoTokenizer

    from benchmarks.stack import models_dir
    from rollout.engines.models import SMOLLM2, TINY_QWEN3, resolve
    from rollout.rl.batches import Batch
    from rollout.rl.losses import PPO, LossConfig
    from rollout.training.local import LocalTrainer, LocalTrainerConfig
    from rollout.training.logprobs import Layout

    model = resolve(TINY_QWEN3 if quick else SMOLLM2, models_dir())
    segments = (
        _group_segments(quick)
        if case == "group"
        else _coding_segments(AutoTokenizer.from_pretrained(model), quick)
    )
    batch = Batch.of("default", segments)
    trainer = LocalTrainer(model, LocalTrainerConfig(lora_rank=8, lora_alpha=16), LossConfig(PPO()))
    if side == "unshared":
        trainer.layout = Layout.packed
    cuda = trainer.device.startswith("cuda")
    held = psutil.Process().memory_info().rss
    trainer.step(batch)  # warm-up: the allocator's and the kernels' first use
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, metrics = [], {}
    for _ in range(1 if quick else STEPS):
        started = time.perf_counter()
        metrics = trainer.step(batch)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    if cuda:
        peak_mib = torch.cuda.max_memory_allocated() / 2**20
    else:  # ru_maxrss is in KiB on Linux
        peak_mib = max(0.0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - held) / 2**20
    return {
        "case": case,
        "side": side,
        "device": trainer.device,
        "segments": len(segments),
        "segment_tokens": int(metrics["segment_tokens"]),
        "computed_tokens": int(metrics["computed_tokens"]),
        "s_per_step": sum(times) / len(times),
        "peak_mib": round(peak_mib, 1),
    }


def _in_own_process(case: str, side: str, quick: bool) -> dict[str, Any]:
    # An executor, not a pool: a process that dies fails the call instead of leaving it waiting forever.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as executor:
        return executor.submit(_measure, case, side, quick).result()


def main(quick: bool = False) -> int:
    results: dict[str, Any] = {"benchmark": "treetrain", "machine": f"{platform.machine()}, {_cores()} cores"}
    for case in ("group", "coding"):
        sides = {side: _in_own_process(case, side, quick) for side in SIDES}
        shared, unshared = sides["shared"], sides["unshared"]
        results[case] = {
            **sides,
            "speedup": unshared["s_per_step"] / shared["s_per_step"],
            "compute_ratio": unshared["computed_tokens"] / shared["computed_tokens"],
            "memory_ratio": shared["peak_mib"] / unshared["peak_mib"] if unshared["peak_mib"] else None,
        }
        print(
            f"{case}: {unshared['s_per_step']:.1f} s → {shared['s_per_step']:.1f} s a step "
            f"({results[case]['speedup']:.2f}×), {unshared['computed_tokens']} → {shared['computed_tokens']} "
            f"tokens computed, peak {unshared['peak_mib']:.0f} → {shared['peak_mib']:.0f} MiB",
            flush=True,
        )
    results["goal_met"] = results["group"]["speedup"] >= 2.5
    print(json.dumps(results))
    return 0


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))
