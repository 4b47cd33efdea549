"""`uv run python -m benchmarks race`: a learning race against TRL on this machine (issue 20).

Two runs, one after the other, each for `BUDGET_S` (15 minutes) of wall clock from the start of its process:
- TRL: `GRPOTrainer` in a process of its own (`_trl`), on the same model as `cpu-tiny` (SmolLM2-135M-Instruct,
  the directory `rollout.engines.models.resolve` builds), a LoRA of the same rank, alpha and target modules,
  the same learning rate and gradient clip, 2 groups of 4 completions per optimizer step, at most 16 sampled
  tokens at temperature 1, on CPU in float32. Its prompts are the arithmetic environment's questions (the
  environment's own task source, group 0, 1, ...) as one user message: the chat template adds SmolLM2's
  default system prompt, token for token what rollout's agent sends. Its reward function is the environment's
  `score`. A callback records each step's mean reward and wall-clock time, and stops training at the budget.
- rollout: `rollout train arithmetic.environment:environment --preset cpu-tiny` on an embedded stack of its
  own (benchmarks.learning), interrupted at the budget; its curve is every step's batch mean reward from the
  ledger, steps whose groups all lacked signal included (TRL trains on those too, with zero advantages).

Result (one JSON line on stdout; progress on stderr): per side the steps, episodes, final reward (the mean of
the last `WINDOW` steps), start-up time, seconds per step and when the moving mean of `WINDOW` steps first
reaches TRL's final reward, both from the start of the process (model load and, for rollout, the stack
included) and from the start of training (TRL's `on_train_begin`, rollout's `RunCreated`); the ratio
rollout/TRL of each. Target: rollout reaches it in at most two-thirds of TRL's time, counted from the start of
the process (what a user waits for). A plot of both moving means against wall minutes goes to
`benchmarks/race.png`. `--quick` checks that it works: both sides on `cpu-micro`'s tiny random model, TRL for
`QUICK_TRL_S`, rollout for 2 steps, and no plot.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.learning import train_on_stack
from benchmarks.stack import models_dir

BUDGET_S = 15 * 60
QUICK_BUDGET_S = 2 * 60
QUICK_TRL_S = 60
QUICK_PRESET, QUICK_STEPS = "cpu-micro", 2
WINDOW = 5
PRESET = "cpu-tiny"
STEPS = 10_000  # more than either side finishes: the budget ends both runs
TEMPERATURE = 1.0  # rollout's agent sends none; the gateway samples at 1.0, the OpenAI default
PLOT = Path(__file__).with_name("race.png")


def _trl(out: Path, budget_s: float, started_at: float, preset: str) -> None:
    """In a process of its own: GRPO with TRL until `budget_s` after `started_at` (epoch seconds); one JSON
    line per step (`at`: epoch seconds, `reward`, `completion_tokens`, `generate_s`), after a first line
    `{"began": at}`."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from arithmetic.environment import environment, score
    from rollout import config
    from rollout.engines.models import resolve
    from rollout.training.local import LocalTrainerConfig

    settings = config.load([f"preset={preset}"])
    trainer_settings, group_size = settings.trainer, environment.group_size
    prompts = [environment.source.parameters(group) for group in range(2 * STEPS)]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p["question"]}], "answer": p["answer"]} for p in prompts]
    )

    def reward(completions: list[list[dict[str, str]]], answer: list[str], **_: Any) -> list[float | None]:
        return [
            score(completion[-1]["content"], a) for completion, a in zip(completions, answer, strict=True)
        ]

    timing = {"generate_s": 0.0}

    class Race(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            with out.open("a") as file:
                file.write(json.dumps({"began": time.time()}) + "\n")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if time.time() - started_at >= budget_s:
                control.should_training_stop = True

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                point = {
                    "step": state.global_step,
                    "at": time.time(),
                    "reward": logs["reward"],
                    "completion_tokens": logs.get("completions/mean_length", 0.0),
                    **timing,
                }
                with out.open("a") as file:
                    file.write(json.dumps(point) + "\n")
                timing["generate_s"] = 0.0

    with tempfile.TemporaryDirectory(prefix="rollout-bench-race-trl-") as scratch:
        args = GRPOConfig(
            output_dir=scratch,
            use_cpu=True,
            bf16=False,
            model_init_kwargs={"dtype": "float32"},
            gradient_checkpointing=False,  # rollout's trainer does not checkpoint on CPU
            learning_rate=trainer_settings.learning_rate,
            lr_scheduler_type="constant",  # rollout's is constant
            weight_decay=0.0,
            max_grad_norm=trainer_settings.max_grad_norm,
            per_device_train_batch_size=trainer_settings.groups_per_batch * group_size,
            gradient_accumulation_steps=1,
            num_generations=group_size,
            max_completion_length=settings.run.max_tokens,
            temperature=TEMPERATURE,
            top_p=1.0,
            top_k=0,
            beta=0.0,  # no KL term, as rollout
            num_iterations=1,
            epsilon=0.2,  # rollout's PPO clip: [1 - 0.2, 1 + 0.28]
            epsilon_high=0.28,
            loss_type="dapo",  # token-level, normalised over the batch's sampled tokens, as rollout
            scale_rewards="group",  # (r - group mean) / group std, as rollout's group_norm
            shuffle_dataset=False,
            max_steps=STEPS,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=0,
        )
        lora = LocalTrainerConfig()
        trainer = GRPOTrainer(
            model=resolve(trainer_settings.model, models_dir()),
            reward_funcs=reward,
            args=args,
            train_dataset=dataset,
            peft_config=LoraConfig(
                r=trainer_settings.lora_rank,
                lora_alpha=trainer_settings.lora_alpha,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            ),
            callbacks=[Race()],
        )
        generate = trainer._generate  # pyright: ignore[reportPrivateUsage]

        def timed(prompts: list[Any]) -> Any:
            began = time.perf_counter()
            try:
                return generate(prompts)
            finally:
                timing["generate_s"] += time.perf_counter() - began

        setattr(trainer, "_generate", timed)  # noqa: B010 (a method replaced on one instance)
        trainer.train()


def _run_trl(budget_s: float, out: Path, preset: str) -> float:
    """TRL in its own process until the budget (with a grace period for its last step); its start time."""
    started_at = time.time()
    command = [sys.executable, "-m", "benchmarks.race", str(out), str(budget_s), str(started_at), preset]
    log = out.with_suffix(".log")
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            cwd=Path(__file__).parent.parent,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            code = process.wait(timeout=budget_s + 300)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    if code != 0:
        print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
        raise SystemExit(f"the TRL run failed (exit {code}); its output is above")
    return started_at


def _smoothed(rewards: list[float]) -> list[float]:
    return [statistics.mean(rewards[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(rewards))]


def _side(
    points: list[dict[str, Any]], started_at: float, began: float, target: float, per_step: int
) -> dict[str, Any]:
    """One side's numbers; `points` are its steps within the budget, in order, with `at` (epoch seconds) and
    `reward`; `per_step` episodes each."""
    smoothed = _smoothed([p["reward"] for p in points])
    full = min(WINDOW, len(points)) - 1  # the moving mean counts once its window is full
    reached = next((p["at"] for i, p in enumerate(points) if i >= full and smoothed[i] >= target), None)
    span = points[-1]["at"] - points[0]["at"]
    return {
        "steps": len(points),
        "episodes": per_step * len(points),
        "final_reward": round(smoothed[-1], 4),
        "startup_s": round(began - started_at, 1),
        "first_step_s": round(points[0]["at"] - started_at, 1),
        "seconds_per_step": round(span / max(1, len(points) - 1), 2),
        "reached_s": None if reached is None else round(reached - started_at, 1),
        "reached_s_since_training": None if reached is None else round(reached - began, 1),
    }


def _ratio(rollout: float | None, trl: float | None) -> float | None:
    return None if rollout is None or not trl else round(rollout / trl, 3)


def _plot(curves: dict[str, tuple[list[dict[str, Any]], float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5), dpi=120)
    for (name, (points, started_at)), color in zip(curves.items(), ("tab:orange", "tab:blue"), strict=True):
        minutes = [(p["at"] - started_at) / 60 for p in points]
        axis.plot(minutes, _smoothed([p["reward"] for p in points]), "-", color=color, label=name)
    axis.set_xlabel("wall minutes since the process started")
    axis.set_ylabel(f"mean reward (last {WINDOW} steps)")
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(PLOT)
    plt.close(figure)


def main(quick: bool = False) -> int:
    from arithmetic.environment import environment
    from rollout.engines.models import SMOLLM2, TINY_QWEN3, resolve

    budget_s = QUICK_BUDGET_S if quick else BUDGET_S
    trl_budget_s = QUICK_TRL_S if quick else budget_s
    preset, steps = (QUICK_PRESET, QUICK_STEPS) if quick else (PRESET, STEPS)
    resolve(TINY_QWEN3 if quick else SMOLLM2, models_dir())
    with tempfile.TemporaryDirectory(prefix="rollout-bench-race-") as scratch:
        out = Path(scratch) / "trl.jsonl"
        print(f"race: TRL GRPOTrainer for {trl_budget_s / 60:.1f} min", file=sys.stderr)
        trl_started = _run_trl(trl_budget_s, out, preset)
        lines = [json.loads(line) for line in out.read_text().splitlines()]
    trl_began = next(line["began"] for line in lines if "began" in line)
    trl_points = [p for p in lines if "reward" in p and p["at"] - trl_started <= trl_budget_s]
    print(f"race: TRL ran {len(trl_points)} steps; now rollout train --preset {preset}", file=sys.stderr)
    trained = train_on_stack(preset, steps, budget_s, "race", skipped=True)
    if trained.exit_code not in (None, 0) or not trained.curve:
        print(trained.log_tail, file=sys.stderr)
        raise SystemExit(f"rollout train failed (exit {trained.exit_code}); its output is above")
    rollout_points = [p for p in trained.curve if p["at"] - trained.started_at <= budget_s]
    if not trl_points or not rollout_points:
        raise SystemExit(
            f"a side finished no step within the budget (TRL {len(trl_points)}, rollout {len(rollout_points)})"
        )
    rollout_began = trained.curve[0]["at"] - trained.curve[0]["minutes"] * 60  # RunCreated
    per_step = trained.settings.trainer.groups_per_batch * environment.group_size
    target = _smoothed([p["reward"] for p in trl_points])[-1]
    trl = _side(trl_points, trl_started, trl_began, target, per_step)
    ours = _side(rollout_points, trained.started_at, rollout_began, target, per_step)
    trl["generate_s_per_step"] = round(statistics.mean(p["generate_s"] for p in trl_points), 2)
    trl["completion_tokens_mean"] = round(statistics.mean(p["completion_tokens"] for p in trl_points), 1)
    ours["skipped_steps"] = sum(1 for p in rollout_points if not p["trained"])
    ratio = _ratio(ours["reached_s"], trl["reached_s"])
    if not quick:
        _plot(
            {
                "TRL GRPOTrainer": (trl_points, trl_started),
                f"rollout train --preset {PRESET}": (
                    rollout_points,
                    trained.started_at,
                ),
            },
            f"SmolLM2-135M-Instruct, LoRA r={trained.settings.trainer.lora_rank}, arithmetic, "
            f"{os.cpu_count()} CPUs, {budget_s / 60:.0f} min each",
        )
    summary = {
        "benchmark": "race",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
        "budget_s": budget_s,
        "model": trained.settings.trainer.model,
        "window": WINDOW,
        "trl_final_reward": round(target, 4),
        "trl": trl,
        "rollout": ours,
        "ratio": ratio,
        "ratio_since_training": _ratio(ours["reached_s_since_training"], trl["reached_s_since_training"]),
        "plot": None if quick else str(PLOT),
        "target_two_thirds_met": ratio is not None and ratio <= 2 / 3,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":  # the TRL side, in its own process: OUT BUDGET_S STARTED_AT PRESET
    _trl(Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
