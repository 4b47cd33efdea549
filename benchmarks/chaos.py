"""`uv run python -m benchmarks chaos`: SIGKILL each service of the embedded stack at a random moment of a
training run, and check that the run finishes by itself with nothing lost or counted twice.

Everything is the real thing, started the way a user starts it: `rollout up` (Postgres, the Temporal dev
server, the local engine serving tiny-qwen3, the gateway, a runner, and the supervisor that keeps them alive),
then `rollout train arithmetic.environment:environment --preset cpu-micro trainer.steps=N --json` as a
subprocess (which starts the trainer). Arithmetic is replayable.

Cases, each on the same stack, each its own run:
- `baseline`: no kill; its counts are what every other case must match.
- one per service (gateway, engine, runner, trainer, postgres, temporal) and seed: the service's process is
  SIGKILLed once, at a moment drawn uniformly from the first 80% of the baseline's duration, or when the run
  reports its last step if that comes first (a run shorter than the baseline, on a machine less loaded than
  during it, is still running then: it serves that step's checkpoint and sums up); a run that ends before its
  kill all the same is played again with the window halved.
- `everything`: the supervisor and every service SIGKILLed at once, then `rollout up` (the `rollout train`
  that follows the run is left running and must ride it out).
- `monkey`: a longer run; a random service SIGKILLed every 20-40 s until the run ends.

A case passes when `rollout train` exits 0 by itself (within `CASE_TIMEOUT_S`) and the ledger shows:
- every step trained once: one assembled batch and one checkpoint per step, versions 1..N, each converted once
  and given one serving target; every checkpoint was served during the run;
- no turn recorded twice: one (non-aborted) turn per seat and turn index;
- no replayable episode abandoned (no abandoned attempt, no failed episode);
- the same counts (steps, batches, checkpoints, conversions, serving targets) as the baseline.
Prints one JSON line per case, then the summary as the last line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICES = ("gateway", "engine", "runner", "trainer", "postgres", "temporal")
ENVIRONMENT = "arithmetic.environment:environment"
POLICY_NAME = "default"
CASE_TIMEOUT_S = 900.0
TRIES = 3  # a case whose run ended before its kill is played again, with its kill drawn earlier
NOTHING_KILLED = "the run ended before anything was killed: nothing was tested"
ROLLOUT = str(Path(sys.executable).parent / "rollout")


@dataclass
class ChaosStack:
    """An embedded stack in `data_dir` on ports of its own, driven through the `rollout` command."""

    data_dir: Path
    models_dir: Path
    cwd: Path
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from rollout_testing.stacks import isolated_overrides

        self.overrides = [
            *isolated_overrides(self.data_dir, gateway=True),
            f"models_dir={self.models_dir}",
            # Short backoffs would only hide a slow recovery; the defaults are what users get.
        ]

    @property
    def settings(self) -> Any:
        from rollout import config

        return config.load(["preset=cpu-micro", *self.overrides])

    def rollout(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ROLLOUT, *args, *self.overrides], cwd=self.cwd, capture_output=True, text=True, timeout=timeout
        )

    def up(self, steps: int) -> None:
        # The trainer worker is told the trainer's settings: with the steps the runs train, the first
        # `rollout train` finds it as it wants it, rather than restarting it (a model load) mid warm-up.
        done = self.rollout("up", "preset=cpu-micro", f"trainer.steps={steps}", "--json")
        if done.returncode != 0:
            raise RuntimeError(f"rollout up failed:\n{done.stderr[-3000:]}{done.stdout[-2000:]}")

    def down(self) -> None:
        self.rollout("down", timeout=300)

    def pid_of(self, service: str) -> int | None:
        from rollout.stack.postgres import EmbeddedPostgres
        from rollout.stack.processes import read_pid_file

        if service == "postgres":
            postgres = self.settings.services.postgres
            return EmbeddedPostgres(self.data_dir.resolve(), postgres.host, postgres.port).pid()
        record = read_pid_file(self.data_dir / "run" / f"{service}.pid")
        return record.pid if record else None

    def kill(self, service: str) -> int | None:
        pid = self.pid_of(service)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return None
        return pid

    def restarts(self) -> dict[str, int]:
        from rollout.stack.supervisor import read_state

        return {name.lower(): state.restarts for name, state in read_state(self.data_dir).items()}

    def wait_healthy(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        done = None
        while time.monotonic() < deadline:
            done = self.rollout("status", "--json", timeout=60)
            if done.returncode == 0 and json.loads(done.stdout)["healthy"]:
                return
            time.sleep(2)
        raise RuntimeError(
            f"the stack is not healthy after {timeout_s:.0f}s: {done.stdout[-2000:] if done else ''}"
        )

    def train(self, run: str, steps: int, log: Path) -> subprocess.Popen[bytes]:
        command = [ROLLOUT, "train", ENVIRONMENT, "--preset", "cpu-micro", f"trainer.steps={steps}"]
        with log.open("wb") as out:
            return subprocess.Popen(
                [*command, "--run", run, "--json", *self.overrides], cwd=self.cwd, stdout=out, stderr=out
            )


def ledger_counts(settings: Any, run: str) -> dict[str, Any]:
    """What the ledger holds for `run`: the counts a case is judged by, and the doubles it must not hold."""
    from rollout.ledger import Kind, Ledger
    from rollout.ledger.queries import read_all, run_progress, run_turns
    from rollout.ledger.streams import (
        SERVING_TARGETS,
        policy_bridges_stream,
        policy_checkpoints_stream,
        run_episodes_stream,
    )
    from rollout.workflows.names import run_policy

    async def read() -> dict[str, Any]:
        policy = run_policy(run, POLICY_NAME)
        async with await Ledger.connect(settings.ledger_url) as ledger:
            progress = await run_progress(ledger, run)
            checkpoints = [
                e
                for e in await read_all(ledger, policy_checkpoints_stream(policy))
                if e.kind == Kind.CHECKPOINT_CREATED
            ]
            converted = [
                e
                for e in await read_all(ledger, policy_bridges_stream(policy))
                if e.kind == Kind.CHECKPOINT_CONVERTED
            ]
            targets = [
                e for e in await read_all(ledger, SERVING_TARGETS) if e.payload.get("policy") == policy
            ]
            turns = await run_turns(ledger, run)
            # Why an episode or an attempt ended unfinished: a failed case says what went wrong.
            abandoned = [
                e
                for e in await read_all(ledger, run_episodes_stream(run))
                if e.kind == Kind.EPISODE_ABANDONED
            ]
        per_turn = Counter(
            (e.stream, int(e.payload["turn_index"])) for e in turns if not e.payload.get("aborted")
        )
        trained = progress.policies.get(policy)
        return {
            "episodes_finished": progress.episodes_finished,
            "episodes_failed": progress.episodes_failed,
            "attempts_abandoned": progress.attempts_abandoned,
            "batches": trained.batches_assembled if trained else 0,
            "checkpoints": len(checkpoints),
            "checkpoint_versions": sorted(int(e.payload["version"]) for e in checkpoints),
            "conversions": len(converted),
            "serving_targets": len(targets),
            "turns": sum(per_turn.values()),
            "turns_doubled": sum(1 for n in per_turn.values() if n > 1),
            "abandoned_errors": [str(e.payload.get("error"))[-600:] for e in abandoned][:4],
        }

    return asyncio.run(read())


COMPARED = ("batches", "checkpoints", "checkpoint_versions", "conversions", "serving_targets")


def judge(
    counts: dict[str, Any], steps: int, summary: dict[str, Any] | None, baseline: dict[str, Any] | None
) -> list[str]:
    """Every way the run lost or doubled something ([] when it did not)."""
    problems: list[str] = []
    if summary is None:
        return ["rollout train did not finish with a summary"]
    if counts["checkpoint_versions"] != list(range(1, steps + 1)):
        problems.append(f"checkpoint versions {counts['checkpoint_versions']}, not 1..{steps}")
    for name in ("batches", "conversions", "serving_targets"):
        if counts[name] != steps:
            problems.append(f"{counts[name]} {name.replace('_', ' ')} for {steps} steps")
    if counts["turns_doubled"]:
        problems.append(f"{counts['turns_doubled']} turns recorded twice")
    if counts["attempts_abandoned"] or counts["episodes_failed"]:
        problems.append(
            f"{counts['attempts_abandoned']} attempts abandoned, {counts['episodes_failed']} episodes failed: "
            + " | ".join(counts.get("abandoned_errors", []))
        )
    if set(summary.get("served", [])) != set(summary.get("checkpoints", [])):
        problems.append("not every checkpoint was served during the run")
    if baseline is not None:
        differ = [name for name in COMPARED if counts[name] != baseline[name]]
        if differ:
            problems.append(f"counts differ from the uninterrupted run: {', '.join(differ)}")
    return problems


@dataclass
class Case:
    name: str
    steps: int
    seed: int = 0
    service: str | None = None  # killed once, at a random moment
    everything: bool = False
    monkey: bool = False


def play(
    stack: ChaosStack, case: Case, *, base_s: float, baseline: dict[str, Any] | None, scratch: Path
) -> dict[str, Any]:
    """Run one case to its end; return its JSON line."""
    rng = random.Random(f"{case.name}/{case.seed}")
    run = f"chaos-{case.name}-{case.seed}-{os.getpid()}"
    log = scratch / f"{run}.log"
    before = stack.restarts()
    started = time.monotonic()
    train = stack.train(run, case.steps, log)
    killed: list[dict[str, Any]] = []

    def kill(service: str) -> None:
        # A service that is not running yet (the trainer, before `rollout train` starts it) is waited for.
        deadline = time.monotonic() + 120
        while (pid := stack.kill(service)) is None and train.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        killed.append({"service": service, "pid": pid, "at_s": round(time.monotonic() - started, 1)})

    last_step = f"] step {case.steps} ·"

    def sleep_while_training(seconds: float, *, at_the_latest_on_the_last_step: bool = False) -> bool:
        """Sleep `seconds` while the run goes on (False once it has ended); with
        `at_the_latest_on_the_last_step`, wake early when the run reports its last step: it is still running
        then (serving that step's checkpoint and summing up), so a kill drawn later than this run lasts
        lands there rather than after the run."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if train.poll() is not None:
                return False
            if at_the_latest_on_the_last_step and last_step in log.read_text(errors="replace"):
                return True
            time.sleep(0.2)
        return True

    if case.service is not None and sleep_while_training(
        rng.uniform(1.0, max(2.0, 0.8 * base_s)), at_the_latest_on_the_last_step=True
    ):
        kill(case.service)
    # Everything dies once the run exists (while `rollout train` is still starting the stack, it would stop
    # with "run `rollout up`": nothing to recover yet).
    while case.everything and f"run {run}: training" not in log.read_text(errors="replace"):
        if not sleep_while_training(0.2):
            break
    if case.everything and sleep_while_training(
        rng.uniform(0.1 * base_s, 0.5 * base_s), at_the_latest_on_the_last_step=True
    ):
        kill_all(stack, killed, started)
        up = stack.rollout("up", "preset=cpu-micro", "--json")
        killed.append(
            {"service": "rollout up", "exit": up.returncode, "at_s": round(time.monotonic() - started, 1)}
        )
    if case.monkey:
        while sleep_while_training(rng.uniform(20.0, 40.0)):
            kill(rng.choice(SERVICES))
    try:
        train.wait(timeout=max(0.0, CASE_TIMEOUT_S - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        train.kill()
        train.wait()
    wall = time.monotonic() - started
    output = log.read_text(errors="replace")
    summary = _last_json(output) if train.returncode == 0 else None
    stack.wait_healthy()
    counts = ledger_counts(stack.settings, run)
    problems = judge(counts, case.steps, summary, baseline)
    if (case.service or case.everything or case.monkey) and not any(
        k.get("pid") or k.get("pids") for k in killed
    ):
        problems.append(NOTHING_KILLED)
    after = stack.restarts()
    line = {
        "case": case.name,
        "seed": case.seed,
        "steps": case.steps,
        "killed": killed,
        "finished": train.returncode == 0,
        "wall_s": round(wall, 1),
        "restarts": {
            name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)
        },
        **{
            name: counts[name]
            for name in ("episodes_finished", "turns", "batches", "checkpoints", "conversions")
        },
        "ok": not problems,
        "problems": problems,
    }
    if problems:
        line["log_tail"] = output[-1500:]
    return line


def kill_all(stack: ChaosStack, killed: list[dict[str, Any]], started: float) -> None:
    from rollout.stack.processes import read_pid_file

    supervisor = read_pid_file(stack.data_dir / "run" / "supervisor.pid")
    pids = [supervisor.pid] if supervisor else []
    pids += [pid for service in SERVICES if (pid := stack.pid_of(service)) is not None]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed.append({"service": "everything", "pids": pids, "at_s": round(time.monotonic() - started, 1)})


def _last_json(output: str) -> dict[str, Any] | None:
    for line in reversed(output.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def matrix(steps: int, seeds: int, *, extra: bool, monkey_steps: int) -> list[Case]:
    cases = [
        Case(name=service, steps=steps, seed=seed, service=service)
        for seed in range(seeds)
        for service in SERVICES
    ]
    if extra:
        cases.append(Case(name="everything", steps=steps, everything=True))
        cases.append(Case(name="monkey", steps=monkey_steps, monkey=True))
    return cases


def run_matrix(
    cases: list[Case],
    *,
    steps: int,
    models_dir: Path,
    scratch: Path,
    emit: Callable[[dict[str, Any]], None] = print,
    warm_up: bool = True,
) -> list[dict[str, Any]]:
    """The baseline, then every case, on one stack in `scratch`; each case's line is passed to `emit`. Without
    `warm_up` the baseline is the stack's first run, so it lasts longer than the cases' runs (the trainer's
    start, the model's first load) and kills are drawn from a longer window: each still lands by the run's
    last step."""
    stack = ChaosStack(data_dir=scratch / "data", models_dir=models_dir, cwd=scratch)
    lines: list[dict[str, Any]] = []
    try:
        stack.up(steps)
        # A first run warms what only a first run pays for (the trainer's start, the model's first load), so
        # the baseline's duration is that of a run like the cases' own: kills are drawn within it.
        if warm_up:
            warm = play(stack, Case(name="warm-up", steps=steps), base_s=0.0, baseline=None, scratch=scratch)
            emit(warm)
            lines.append(warm)
        first = play(stack, Case(name="baseline", steps=steps), base_s=0.0, baseline=None, scratch=scratch)
        base_s = first["wall_s"]
        emit(first)
        lines.append(first)
        baseline = ledger_counts(stack.settings, f"chaos-baseline-0-{os.getpid()}") if first["ok"] else None
        for case in cases:
            compared = baseline if case.steps == steps else None
            window = base_s * case.steps / steps
            line: dict[str, Any] = {}
            for attempt in range(1, TRIES + 1):
                line = play(stack, case, base_s=window, baseline=compared, scratch=scratch)
                line["tries"] = attempt
                problems: list[str] = line["problems"]
                if NOTHING_KILLED not in problems:
                    break
                # Runs vary in length with the machine's load: draw the next kill from a window half as long.
                window /= 2
            emit(line)
            lines.append(line)
    finally:
        stack.down()
    return lines


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(quick: bool = False) -> int:
    from rollout.engines.models import TINY_QWEN3, resolve

    # A SIGTERM unwinds like Ctrl-C, so the stack in the scratch directory is stopped, not orphaned.
    signal.signal(signal.SIGTERM, _interrupt)
    models_dir = Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )
    resolve(TINY_QWEN3, models_dir)
    steps = 3 if quick else 6
    seeds = 1 if quick else 2
    cases = matrix(steps, seeds, extra=not quick, monkey_steps=20)
    with tempfile.TemporaryDirectory(prefix="rollout-bench-chaos-") as scratch:
        lines = run_matrix(
            cases,
            steps=steps,
            models_dir=models_dir,
            scratch=Path(scratch),
            emit=lambda line: print(json.dumps(line), flush=True),
        )
    failed = [f"{line['case']}/{line['seed']}" for line in lines if not line["ok"]]
    lines = [line for line in lines if line["case"] != "warm-up"]
    summary = {
        "benchmark": "chaos",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
        "environment": ENVIRONMENT,
        "steps": steps,
        "cases": len(lines),
        "passed": len(lines) - len(failed),
        "failed": failed,
        "baseline_wall_s": lines[0]["wall_s"],
        "slowest_case": max(lines, key=lambda line: line["wall_s"])["case"],
        "slowest_wall_s": max(line["wall_s"] for line in lines),
        "all_finished_nothing_lost_or_doubled": not failed,
    }
    print(json.dumps(summary))
    return 0 if not failed else 1
