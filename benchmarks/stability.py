"""`uv run python -m benchmarks stability`: at max_lag 8, does decoupled PPO stay stable where unclipped
importance sampling degrades?

Two runs, one after the other, of the user's command `rollout train arithmetic.environment:environment
--preset cpu-tiny` (SmolLM2-135M-Instruct, LoRA rank 8, on CPU; every service its own process on an embedded
stack of its own in a scratch directory, as `benchmarks.learning` runs it), each until `BUDGET_S` (12 minutes)
has passed, then Ctrl-C. Both with `run.max_lag=8`, `run.groups_in_flight=18`, cpu-tiny's learning rate (2e-4)
and `trainer.updates_per_batch=4`: four AdamW steps over each batch against the π_old of its first pass, as
PPO is meant to run. With one update per batch PPO's ratio π_θ/π_old is 1 and its clip never acts, and the two
losses differed only in the cap on the behaviour weight: at 2e-4 neither moved far enough in 8 steps to matter
(ESS ≥ 0.98 in both), at 5e-4 and 1e-3 both collapsed to one reply whatever the loss (benchmarks/RESULTS.md).
They differ only in the loss:
- `ppo`: decoupled PPO (the default, `trainer.loss=ppo`): the behaviour weight π_old/μ is capped at
  `trainer.loss_params.is_cap` (2, the default) and the ratio π_θ/π_old clipped to [0.8, 1.28], which from the
  second update on stops the tokens that already moved in their advantage's direction.
- `unclipped_is`: `trainer.loss=truncated_is trainer.loss_params.is_cap=1e9`: every token weighted by its
  whole ratio π_θ/μ, a cap no ratio reaches, and nothing stops a token within the batch's updates.
Why 18 groups in flight: the supply may have started (steps trained + max_lag + 1) × groups_per_batch groups
(`rollout.rl.selection.supply_allowance`), 18 more than have been trained with max_lag 8 and 2 groups
per step. With 18 in flight the in-flight cap never binds before that allowance does: every group starts the
moment it is allowed, on the oldest checkpoint the bound permits, so once the pipeline is full each batch is
trained 8 checkpoints after its episodes began, whether sampling or training is the slower side (with
cpu-tiny's 4 in flight and sampling the slower side, staleness would stay near 4 / 2 − 1 = 1).

Per batch, from the ledger (each step's `CheckpointCreated` metrics; a step whose every group had no signal is
skipped, has no checkpoint and counts for the reward only): the batch mean reward, the effective sample size
of the ratios (ESS, (Σρ)² / (n Σρ²) over the sampled tokens' ρ = π_θ/μ: how far sampler and learner drifted
apart, whatever the loss) and of the weights the loss applies (`weight_ess`: ρ itself for unclipped IS, the
capped or clipped weight for PPO; a token the clip stopped weighs 0, so PPO's clip acting lowers its weight
ESS too), ratio_max, clipped_fraction, staleness mean and max, and grad_norm (before clipping to
trainer.max_grad_norm), each over the batch's four updates (means averaged, maxima the largest). Progress goes
to stderr; the last line on stdout is one JSON object: per run the batches it ran (`batches_run`) and, over
the first `compared_batches` of each (the fewer of the two runs' counts: the runs are compared at equal steps,
so one that started slower on a colder machine is not judged on fewer, less stale steps), the steps, the
reward's mean over the first and last `WINDOW` batches, both ESSs' means over the last `WINDOW` trained steps
and their minima, staleness mean and max, grad_norm max; and the verdict. A run is stable when its last
window's reward is not below its first window's by more than two standard errors (step-to-step noise) and its
weight ESS never fell below `ESS_MIN` = 0.5: ESS = 1 / (1 + CV²) of the weights, so below 0.5 their standard
deviation exceeds their mean and a few tokens dominate the batch's gradient (the usual resampling threshold of
importance samplers, N/2). Target (issue 20): `ppo_stable` and not `is_stable`. Not in `--quick`: the plot
`benchmarks/stability.png` (reward moving mean, ESS and staleness against step). `--quick` runs the same on
`cpu-micro` for 2 steps each (it checks the benchmark works; the lag does not fill, the model is random).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.learning import Trained, train_on_stack
from benchmarks.stack import models_dir

PRESET = "cpu-tiny"
QUICK_PRESET, QUICK_STEPS = "cpu-micro", 2  # `--quick`: the tiny random model, two steps a run
BUDGET_S = 12 * 60
QUICK_BUDGET_S = 2 * 60
STEPS = 10_000  # more than either budget allows: each run ends at its budget
MAX_LAG = 8
GROUPS_PER_BATCH = 2  # cpu-tiny's; set explicitly so the in-flight count below stays right
GROUPS_IN_FLIGHT = (MAX_LAG + 1) * GROUPS_PER_BATCH  # the supply's whole allowance ahead of training
WINDOW = 5
ESS_MIN = 0.5
LEARNING_RATE = 2e-4  # cpu-tiny's: see the docstring
UPDATES_PER_BATCH = 4  # PPO's epochs: from the second update on, its clip acts
COMMON = [
    f"run.max_lag={MAX_LAG}",
    f"trainer.learning_rate={LEARNING_RATE}",
    f"trainer.updates_per_batch={UPDATES_PER_BATCH}",
    f"run.groups_in_flight={GROUPS_IN_FLIGHT}",
    f"trainer.groups_per_batch={GROUPS_PER_BATCH}",
]
RUNS = {
    "ppo": ["trainer.loss=ppo", "trainer.loss_params.is_cap=2.0"],
    "unclipped_is": ["trainer.loss=truncated_is", "trainer.loss_params.is_cap=1e9"],
}
COLORS = {"ppo": "tab:blue", "unclipped_is": "tab:red"}
PLOT = Path(__file__).with_name("stability.png")


def _not_below(last: list[float], first: list[float]) -> bool:
    """The last window's mean is not below the first's by more than two standard errors of the difference."""
    if len(last) < 2 or len(first) < 2:
        return statistics.mean(last) >= statistics.mean(first)
    error = (statistics.variance(last) / len(last) + statistics.variance(first) / len(first)) ** 0.5
    return statistics.mean(last) >= statistics.mean(first) - 2 * error


def _steps(trained: Trained) -> list[dict[str, Any]]:
    """One record per batch: step, minutes, reward, trained, and the trained steps' diagnostics (None if
    skipped)."""
    keys = (
        "effective_sample_size",
        "weight_ess",
        "ratio_max",
        "clipped_fraction",
        "staleness_mean",
        "staleness_max",
    )
    return [
        {
            "step": p["step"],
            "minutes": p["minutes"],
            "reward": p["reward"],
            "trained": p["trained"],
            **{key: p["metrics"].get(key) for key in (*keys, "grad_norm")},
        }
        for p in trained.curve
    ]


def _summary(name: str, trained: Trained, steps: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [s["reward"] for s in steps]
    done = [s for s in steps if s["trained"]]
    ess = [float(s["effective_sample_size"]) for s in done]
    weight_ess = [float(s["weight_ess"]) for s in done]
    window = min(WINDOW, max(1, len(rewards) // 2))
    ess_window = min(WINDOW, max(1, len(ess) // 2))
    first, last = rewards[:window], rewards[-window:]
    weight_ess_min = min(weight_ess)
    return {
        "loss": RUNS[name],
        "steps": len(steps),
        "trained": len(done),
        "skipped": len(steps) - len(done),
        "wall_minutes": round(trained.wall_s / 60, 1),
        "minutes_to_first_step": round(steps[0]["minutes"], 2),
        "window": window,
        "reward_first": round(statistics.mean(first), 4),
        "reward_last": round(statistics.mean(last), 4),
        "ess_last_mean": round(statistics.mean(ess[-ess_window:]), 4),
        "ess_min": round(min(ess), 4),
        "weight_ess_last_mean": round(statistics.mean(weight_ess[-ess_window:]), 4),
        "weight_ess_min": round(weight_ess_min, 4),
        "ratio_max": round(max(float(s["ratio_max"]) for s in done), 3),
        "clipped_fraction_mean": round(statistics.mean(float(s["clipped_fraction"]) for s in done), 4),
        "staleness_mean": round(statistics.mean(float(s["staleness_mean"]) for s in done), 3),
        "staleness_max": max(float(s["staleness_max"]) for s in done),
        "grad_norm_max": round(max(float(s["grad_norm"] or 0.0) for s in done), 3),
        "reward_by_step": [round(r, 3) for r in rewards],
        "ess_by_step": [round(e, 3) for e in ess],
        "weight_ess_by_step": [round(e, 3) for e in weight_ess],
        "staleness_max_by_step": [s["staleness_max"] for s in done],
        "stable": _not_below(last, first) and weight_ess_min >= ESS_MIN,
    }


def _plot(runs: dict[str, list[dict[str, Any]]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (reward, ess, staleness) = plt.subplots(3, 1, figsize=(7, 8), dpi=120, sharex=True)
    for name, steps in runs.items():
        color = COLORS[name]
        x = [s["step"] for s in steps]
        rewards = [s["reward"] for s in steps]
        smoothed = [statistics.mean(rewards[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(rewards))]
        reward.plot(x, rewards, ".", color=color, alpha=0.3)
        reward.plot(x, smoothed, "-", color=color, label=f"{name}: mean of last {WINDOW} batches")
        done = [s for s in steps if s["trained"]]
        trained_x = [s["step"] for s in done]
        ess.plot(trained_x, [s["weight_ess"] for s in done], "-", color=color, label=f"{name}: weights")
        ess.plot(
            trained_x, [s["effective_sample_size"] for s in done], ":", color=color, label=f"{name}: ratios"
        )
        staleness.plot(
            trained_x, [s["staleness_mean"] for s in done], "-", color=color, label=f"{name}: mean"
        )
        staleness.plot(trained_x, [s["staleness_max"] for s in done], "--", color=color, label=f"{name}: max")
    ess.axhline(ESS_MIN, color="grey", linewidth=0.8, linestyle=":", label=f"ESS {ESS_MIN}")
    staleness.axhline(MAX_LAG, color="grey", linewidth=0.8, linestyle=":", label=f"max_lag {MAX_LAG}")
    reward.set_ylabel("batch mean reward")
    ess.set_ylabel("effective sample size")
    ess.set_ylim(0, 1.05)
    staleness.set_ylabel("staleness (versions)")
    staleness.set_xlabel("training step")
    reward.set_title(title, fontsize=9)
    for axis in (reward, ess, staleness):
        axis.grid(alpha=0.3)
        axis.legend(loc="best", fontsize=7)
    figure.tight_layout()
    figure.savefig(PLOT)
    plt.close(figure)


def main(quick: bool = False) -> int:
    from rollout.engines.models import SMOLLM2, TINY_QWEN3, resolve

    resolve(TINY_QWEN3 if quick else SMOLLM2, models_dir())
    budget_s = QUICK_BUDGET_S if quick else BUDGET_S
    preset, steps = (QUICK_PRESET, QUICK_STEPS) if quick else (PRESET, STEPS)
    runs: dict[str, Trained] = {}
    per_step: dict[str, list[dict[str, Any]]] = {}
    settings = None
    for name, loss in RUNS.items():
        overrides = [*COMMON, *loss]
        print(f"{name}: {' '.join(overrides)}, {budget_s / 60:.0f} min…", file=sys.stderr, flush=True)
        trained = train_on_stack(
            preset, steps, budget_s, f"stability-{name}", skipped=True, overrides=overrides
        )
        if trained.exit_code not in (None, 0) or not any(p["trained"] for p in trained.curve):
            print(trained.log_tail, file=sys.stderr)
            raise SystemExit(f"{name}: rollout train failed (exit {trained.exit_code}); its output is above")
        settings = trained.settings
        runs[name] = trained
        per_step[name] = _steps(trained)
        shown = {
            k: v for k, v in _summary(name, trained, per_step[name]).items() if not k.endswith("_by_step")
        }
        print(f"{name}: {shown}", file=sys.stderr, flush=True)
    assert settings is not None
    # At equal steps: a run that started slower (a cold machine) is not judged on fewer, less stale steps.
    compared = min(len(steps) for steps in per_step.values())
    summaries: dict[str, dict[str, Any]] = {}
    for name, trained in runs.items():
        if not any(s["trained"] for s in per_step[name][:compared]):
            raise SystemExit(f"{name}: none of its first {compared} batches was trained: nothing to compare")
        summaries[name] = {
            "batches_run": len(per_step[name]),
            **_summary(name, trained, per_step[name][:compared]),
        }
    ppo, unclipped = summaries["ppo"], summaries["unclipped_is"]
    if not quick:
        _plot(
            per_step,
            f"{PRESET} on arithmetic ({settings.trainer.model}, LoRA r={settings.trainer.lora_rank}, "
            f"{os.cpu_count()} CPUs),\nlr {LEARNING_RATE:g}, {UPDATES_PER_BATCH} updates per batch, "
            f"max_lag {MAX_LAG}, {GROUPS_IN_FLIGHT} groups in flight, "
            f"{budget_s / 60:.0f} min each",
        )
    summary = {
        "benchmark": "stability",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
        "preset": preset,
        "model": settings.trainer.model,
        "budget_minutes_each": round(budget_s / 60, 1),
        "max_lag": MAX_LAG,
        "groups_in_flight": GROUPS_IN_FLIGHT,
        "groups_per_batch": GROUPS_PER_BATCH,
        "ess_min_threshold": ESS_MIN,
        "compared_batches": compared,
        **{f"{name}_{k}": v for name, s in summaries.items() for k, v in s.items() if k != "stable"},
        "ppo_stable": ppo["stable"],
        "is_stable": unclipped["stable"],
        "staleness_reached_max_lag": min(ppo["staleness_max"], unclipped["staleness_max"]) >= MAX_LAG,
        "learning_rate": LEARNING_RATE,
        "updates_per_batch": UPDATES_PER_BATCH,
        "weight_ess_min_difference": round(ppo["weight_ess_min"] - unclipped["weight_ess_min"], 4),
        "reward_last_difference": round(ppo["reward_last"] - unclipped["reward_last"], 4),
        "plot": str(PLOT) if not quick else None,
        "target_met": ppo["stable"] and not unclipped["stable"],
    }
    print(json.dumps(summary))
    return 0
