"""The command line as a user drives it, on one embedded stack that `rollout up` started (real processes,
shared by this module's tests in order; the last one stops it):

- `up` starts a local engine and the gateway agents use; a seat made with `seat new` samples through it.
- Evals: bad input is refused with nothing recorded, the smoke suite and `rollout train … eval.every=1`
  (which scores every checkpoint) play side by side and both end, a runner SIGKILLed and then Temporal stopped
  (SIGSTOP) for seconds mid-eval change no score and double no turn, and a Temporal Schedule fires, pauses,
  survives a restart of the Temporal dev server and resumes.
- Runs: an environment in the user's own folder (its episodes claiming shell sandboxes, which `rollout train`
  serves) trains on the stack started elsewhere; a runner that cannot import an environment stops `train`
  before any run exists; `run list` and `run status` show the ledger's numbers mid-run (paused); `rollout
  down` ends the `rollout train` following it with a word on how to continue; after `rollout up` on other
  settings, `run resume` refuses (the engine serves another model) and `rollout run attach` brings the stack
  to the run's recorded model and trainer settings and finishes the run; `down` stops every service, the
  sandboxes included.
- Two policies on two base models (tiny-qwen3 and SmolLM2) train two steps each: each policy's turns rendered
  with its own model's tokenizer, its checkpoints served only by the engine of its model, which `rollout
  train` started beside the stack's own; a policy naming an unknown model is refused in one line.
- A user's environment with bugs trains on its good groups; each bad episode is recorded once with why, and
  the live lines, the summary and `run status` say so; its MLflow server refuses, which the live lines and
  `run status` say too, naming the setting.
- The reattached run is tracked to W&B (offline) and a real MLflow server: each of its steps lands once in
  each, through `down`, `up` and `attach`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from mlflow import MlflowClient

from rollout.config import load
from rollout.ledger import Kind, Ledger
from rollout.ledger.queries import read_all, run_turns
from rollout.ledger.streams import (
    SERVING_ACKS,
    SERVING_TARGETS,
    policy_checkpoints_stream,
    run_episodes_stream,
)
from rollout.net import free_port
from rollout.sandbox.hosting import sandbox_workdir
from rollout.stack.processes import read_pid_file
from rollout.tracking.spans import step_trace_id
from rollout.tracking.step_metrics import StepMetrics, step_metrics
from rollout.tracking.wandb_files import history
from rollout.tracking.wandb_sink import wandb_run_id
from rollout.workflows.names import run_policy
from rollout_testing.otlp_receiver import OtlpReceiver
from rollout_testing.stacks import isolated_overrides
from tests.cli_stack import (
    ROLLOUT,
    UserStack,
    episodes_in_ledger,
    eval_runs,
    finished_episodes,
    ledger_read,
    rollout,
    runs,
    schedule_row,
    services,
    wait_until,
)
from tests.user_envs import MY_ENV, RUNNER_CANNOT_IMPORT, SUITE, TWO_MODELS

pytestmark = pytest.mark.slow


def tracked_run_over(client: MlflowClient, run_id: str) -> bool:
    return client.get_run(run_id).info.status == "FINISHED"


@pytest.fixture(scope="module")
def user_stack(
    tmp_path_factory: pytest.TempPathFactory, models_dir: Path, tiny_qwen3: str
) -> Iterator[UserStack]:
    root = tmp_path_factory.mktemp("user-stack")
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    overrides = [
        *isolated_overrides(root / "data", gateway=True),
        f"models_dir={models_dir}",
        "preset=cpu-micro",
        # The steps most of this module's runs train. The trainer worker is started with the trainer's
        # settings, and every command that starts what is missing (`train`, `eval run`) restarts it when its
        # own differ: with one value for all, only the run of 3 steps (which gives its own last) does.
        "trainer.steps=2",
    ]
    try:
        started = services(rollout("up", "--json", *overrides, cwd=elsewhere))
        yield UserStack(root / "data", overrides, load(overrides), started, elsewhere)
    finally:
        rollout("down", *overrides, cwd=elsewhere, check=False)


def test_up_starts_a_local_engine_and_the_gateway_that_agents_use(user_stack: UserStack) -> None:
    import openai

    up, overrides, here = user_stack.started, user_stack.overrides, user_stack.elsewhere
    assert up["engine"]["healthy"] and up["gateway"]["healthy"] and up["runner"]["healthy"]
    seat = json.loads(
        rollout(
            "seat", "new", "--json", "--gateway-url", up["gateway"]["address"], *overrides, cwd=here
        ).stdout
    )
    client = openai.OpenAI(base_url=seat["base_url"], api_key=seat["api_key"], max_retries=0)
    reply = client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    again = services(rollout("up", "--json", *overrides, cwd=here))
    assert again["gateway"]["pid"] == up["gateway"]["pid"], "up on a running stack starts nothing anew"
    # The engine's prefix cache and load, as its /metrics says them: in the status line and in --json.
    engine = again["engine"]
    assert "prefix cache" in engine["detail"] and "in flight" in engine["detail"], engine["detail"]
    assert engine["in_flight"] == 0 and 0 <= engine["prefix_cache_hit_rate"] < 1


@pytest.mark.timeout(1200)
def test_evals_from_the_command_line(user_stack: UserStack, tmp_path: Path) -> None:
    overrides, settings = user_stack.overrides, user_stack.settings
    (tmp_path / "quick.yaml").write_text(SUITE.format(episodes=4))
    (tmp_path / "changed.yaml").write_text(SUITE.format(episodes=5))
    (tmp_path / "long.yaml").write_text(SUITE.format(episodes=20).replace("version: 1", "version: 2"))
    # Bad input: one paragraph each, exit 1, nothing recorded.
    for args, said in [
        (("eval", "run", "nosuch"), "no suite 'nosuch'"),
        (("eval", "run", "quick.yaml", "--checkpoint", "nosuch/default-step000001"), "no checkpoint"),
        (("eval", "schedule", "quick.yaml", "--cron", "every minute"), "Temporal refused the schedule"),
    ]:
        refused = rollout(*args, *overrides, cwd=tmp_path, check=False)
        assert refused.returncode == 1 and said in refused.stderr and "Traceback" not in refused.stderr
    assert json.loads(rollout("eval", "results", "--json", *overrides, cwd=tmp_path).stdout) == []
    rollout("eval", "register", "quick.yaml", *overrides, cwd=tmp_path)
    changed = rollout("eval", "register", "changed.yaml", *overrides, cwd=tmp_path, check=False)
    assert changed.returncode == 1 and "bump its version" in changed.stderr

    # The smoke suite on the base model plays beside a training run that scores every checkpoint: both end.
    smoke = subprocess.Popen(
        [ROLLOUT, "eval", "run", "smoke", "--checkpoint", "base", "--json", *overrides],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    trained = rollout(
        "train",
        "arithmetic.environment:environment",
        "--preset",
        "cpu-micro",
        "trainer.steps=2",
        "eval.suite=quick",
        "eval.every=1",
        "--run",
        "trained",
        "--json",
        *overrides,
        cwd=tmp_path,
        timeout=600,
    )
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    assert [e["checkpoint"] for e in summary["evals"]] == [
        "trained/default-step000001",
        "trained/default-step000002",
    ], "the run waits for its evals and says their scores"
    out, errors = smoke.communicate(timeout=600)
    assert smoke.returncode == 0, errors[-3000:]
    smoked = json.loads(out.strip().splitlines()[-1])
    assert [s["environment"] for s in smoked["scores"]] == ["arithmetic", "gridworld", "math"]
    assert all(s["failed"] == 0 for s in smoked["scores"])
    scored = json.loads(rollout("eval", "results", "quick", "--json", *overrides, cwd=tmp_path).stdout)
    assert sorted(r["checkpoint"] for r in scored) == [
        "trained/default-step000001",
        "trained/default-step000002",
    ]
    assert all(r["episodes"] == 4 and r["failed"] == 0 for r in scored)
    gate = rollout(
        "eval",
        "compare",
        "quick",
        "trained/default-step000001",
        "latest:trained/default",
        "--max-drop",
        "1",
        *overrides,
        cwd=tmp_path,
    )
    assert "arithmetic" in gate.stdout

    # A runner SIGKILLed mid-eval, and Temporal stopped for seconds: the eval finishes, each episode and its
    # turn recorded once.
    evaluating = subprocess.Popen(
        [ROLLOUT, "eval", "run", "long.yaml", "--checkpoint", "base", "--json", *overrides],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    eval_run = None

    def some_played() -> bool:
        nonlocal eval_run
        runs = ledger_read(settings, lambda ledger: eval_runs(ledger))
        eval_run = next((r for r in runs if r.startswith("eval-quick-2-")), None)
        return eval_run is not None and finished_episodes(settings, eval_run) >= 3

    wait_until(some_played, 300, "the eval played no episode")
    runner = read_pid_file(user_stack.data / "run" / "runner.pid")
    assert runner is not None
    os.kill(runner.pid, signal.SIGKILL)
    # And Temporal stops answering for longer than a wait's read may take: the wait says so and rides it out.
    temporal = read_pid_file(user_stack.data / "run" / "temporal.pid")
    assert temporal is not None
    os.killpg(temporal.pid, signal.SIGSTOP)  # the dev server and its UI's guard, which leads their group
    try:
        time.sleep(12)
    finally:
        os.killpg(temporal.pid, signal.SIGCONT)
    out, errors = evaluating.communicate(timeout=600)
    assert evaluating.returncode == 0, errors[-3000:]
    assert "waiting for Temporal (the eval's result)" in errors and "Traceback" not in errors
    (score,) = json.loads(out.strip().splitlines()[-1])["scores"]
    assert (score["episodes"], score["failed"]) == (20, 0)
    played = eval_run
    assert played is not None and finished_episodes(settings, played) == 20
    turns = ledger_read(settings, lambda ledger: run_turns(ledger, played))
    assert len(turns) == 20 and len({t.payload["seat"] for t in turns}) == 20, "one turn per episode"
    results = json.loads(rollout("eval", "results", "quick@2", "--json", *overrides, cwd=tmp_path).stdout)
    assert [r["score"] for r in results] == [score["score"]], "one result, the one printed"

    # A schedule fires, pauses, outlives a restart of the Temporal dev server, resumes, and is deleted.
    rollout("eval", "schedule", "quick@1", "--every", "2", "--checkpoint", "base", *overrides, cwd=tmp_path)
    wait_until(
        lambda: (schedule_row(overrides, tmp_path) or {}).get("fired", 0) >= 2, 120, "never fired twice"
    )
    (schedule_id,) = [row["schedule"] for row in [schedule_row(overrides, tmp_path)] if row]
    rollout("eval", "schedules", "pause", schedule_id, *overrides, cwd=tmp_path)
    fired = (schedule_row(overrides, tmp_path) or {})["fired"]
    time.sleep(6)
    assert (schedule_row(overrides, tmp_path) or {})["fired"] == fired, "a paused schedule does not fire"
    temporal = read_pid_file(user_stack.data / "run" / "temporal.pid")
    assert temporal is not None
    os.kill(temporal.pid, signal.SIGKILL)
    wait_until(
        lambda: rollout("status", "--json", *overrides, cwd=tmp_path, check=False).returncode == 0,
        180,
        "the supervisor did not bring Temporal back",
    )
    kept = schedule_row(overrides, tmp_path)
    assert kept is not None and kept["schedule"] == schedule_id and kept["paused"] is True
    rollout("eval", "schedules", "resume", schedule_id, *overrides, cwd=tmp_path)
    wait_until(
        lambda: (schedule_row(overrides, tmp_path) or {}).get("fired", 0) > fired,
        120,
        "no firing after resume",
    )
    rollout("eval", "schedules", "delete", schedule_id, *overrides, cwd=tmp_path)
    assert schedule_row(overrides, tmp_path) is None
    base = [
        r
        for r in json.loads(rollout("eval", "results", "quick@1", "--json", *overrides, cwd=tmp_path).stdout)
    ]
    assert [r["checkpoint"] for r in base].count("base") == 1, "every firing found the one result"


@pytest.mark.timeout(600)
def test_a_buggy_environment_trains_on_its_good_groups_and_says_why_the_others_failed(
    user_stack: UserStack, tmp_path: Path
) -> None:
    """tests/user_folder/buggy, from its folder: of every eight groups, one hangs (bounded at 2 s), one
    raises, one scores NaN, one shows an observation past the 2048-token context, and one's task source
    raises. The run trains its steps on the good groups, records each bad episode once with why, retries none
    of them, and says why where the user looks."""
    overrides = user_stack.overrides
    folder = Path(__file__).parent / "user_folder"
    micro = ["--preset", "cpu-micro", "trainer.steps=2", "run.max_failure_rate=0.95", *overrides]
    # Its MLflow server refuses (nothing listens there): `rollout train` says so, naming the setting (on the
    # live line while the run plays, after the summary as it ends), and the run trains on.
    refusing = f"http://127.0.0.1:{free_port()}"
    tracked = ["tracking.backends=[mlflow]", f"tracking.mlflow.tracking_uri={refusing}"]
    trained = rollout(
        "train", "buggy.environment:environment", *micro, *tracked, "--run", "buggy", cwd=folder, timeout=540
    )
    printed = trained.stderr + trained.stdout
    assert "failed: " in trained.stderr, "the live lines name why episodes failed"
    assert "tracking: mlflow refusing (tracking.mlflow.tracking_uri): " in trained.stderr, trained.stderr[
        -3000:
    ]
    assert "Connection refused" in trained.stderr
    summary = " ".join(trained.stdout.split())  # as one line: the console wraps it
    assert "episode(s) failed: respond did not return within 2 s (Environment.turn_timeout_s)" in summary
    assert "Traceback" not in printed
    status = json.loads(
        rollout("run", "status", "buggy", "--json", *overrides, cwd=user_stack.elsewhere).stdout
    )
    assert status["steps"] == 2 and status["state"] == "finished", status
    failures = {f["kind"]: f for f in status["failures"]}
    assert set(failures) >= {"TaskTimedOut", "TaskFailed", "InvalidReward", "RequestRefused"}, failures
    assert failures["RequestRefused"]["reason"].startswith(
        "the gateway refused the conversation's request (400)"
    )
    assert "2048" in failures["RequestRefused"]["reason"], failures["RequestRefused"]
    assert failures["RequestRefused"]["where"].startswith("buggy/environment.py:"), "the respond that made it"
    raised = [f for f in status["failures"] if f["kind"] == "TaskFailed"]
    assert {f["reason"].split(" raised ")[0] for f in raised} == {"respond", "the task source's draw 5"}, (
        raised
    )
    assert all(f["where"].startswith("buggy/environment.py:") for f in raised), raised
    # The newest step's record (rollout.tracking.step_metrics): the numbers a tracker logs.
    newest = status["newest_step"]["default"]
    assert (
        newest["trained"]
        and newest["checkpoint"]
        and newest["environment"] == "buggy.environment:environment"
    ), newest
    assert newest["entropy"] > 0 and newest["loss"] is not None and 0 <= newest["clipped_fraction"] <= 1
    assert 1 <= newest["response_tokens_mean"] <= newest["response_tokens_max"], newest
    assert newest["turns"] >= newest["episodes"] - newest["episodes_failed"] > 0, newest
    assert newest["tokens_trained"] > 0 and newest["train_s"] > 0 and newest["tokens_trained_per_s"] > 0
    assert newest["tokens_sampled_per_s"] > 0 and newest["model_tflops_per_s"] > 0 and newest["mfu"] is None
    [mlflow_state] = status["tracking"]["backends"]
    assert not mlflow_state["ok"] and mlflow_state["logged"] == 0, status["tracking"]

    async def recorded() -> tuple[dict[str, int], list[int]]:
        from temporalio.client import Client

        from rollout.workflows.names import episode_workflow_id

        async with await Ledger.connect(user_stack.settings.ledger_url) as ledger:
            events = await read_all(ledger, run_episodes_stream("buggy"))
        ended: dict[str, int] = {}
        for event in events:
            if (
                event.kind in (Kind.EPISODE_FINISHED, Kind.EPISODE_ABANDONED)
                and "attempt" not in event.payload
            ):
                ended[event.payload["episode"]] = ended.get(event.payload["episode"], 0) + 1
        refused = next(
            e.payload["episode"]
            for e in events
            if e.kind == Kind.EPISODE_ABANDONED
            and e.payload.get("failure", {}).get("kind") == "RequestRefused"
        )
        client = await Client.connect(user_stack.settings.temporal_address)
        history = client.get_workflow_handle(episode_workflow_id("buggy", refused)).fetch_history_events()
        attempts = [
            e.activity_task_started_event_attributes.attempt
            async for e in history
            if e.HasField("activity_task_started_event_attributes")
        ]
        return ended, attempts

    ended, attempts = asyncio.run(recorded())
    assert set(ended.values()) == {1}, "every episode is recorded once"

    async def steps() -> list[StepMetrics]:
        async with await Ledger.connect(user_stack.settings.ledger_url) as ledger:
            return await step_metrics(ledger, "buggy", "default")

    records = asyncio.run(steps())
    assert [r.step for r in records] == list(range(1, len(records) + 1)), "each step once, in order"
    assert sum(r.episodes for r in records) <= len(ended)
    kinds = {f["kind"] for f in status["failures"]}
    assert all(set(r.failures) <= kinds for r in records), "a step's failures are among the run's"
    assert all(r.trained == (r.checkpoint is not None) for r in records)
    assert [r.parent for r in records if r.trained][1:] == [r.checkpoint for r in records if r.trained][:-1]
    assert records[-1].to_json() == newest

    # `rollout run export`: the same records, and every episode recorded for good, in jsonl and parquet.
    import pyarrow.parquet as pq

    said = json.loads(
        rollout(
            "run", "export", "buggy", "--out", str(tmp_path / "j"), "--json", *overrides, cwd=tmp_path
        ).stdout
    )
    lines = Path(said["steps"]).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [r.to_json() for r in records]
    exported = [json.loads(line) for line in Path(said["episodes"]).read_text().splitlines()]
    assert sorted(e["episode"] for e in exported) == sorted(ended), "each episode once"
    assert set() < {e["failure_kind"] for e in exported if not e["finished"]} <= kinds
    rollout(
        "run",
        "export",
        "buggy",
        "--format",
        "parquet",
        "--out",
        str(tmp_path / "p"),
        *overrides,
        cwd=tmp_path,
    )
    table = pq.read_table(tmp_path / "p" / "steps.parquet").to_pylist()
    assert [row["step"] for row in table] == [r.step for r in records]
    assert [json.loads(row["failures"]) for row in table] == [r.failures for r in records]
    assert pq.read_table(tmp_path / "p" / "episodes.parquet").num_rows == len(exported)
    wrong = rollout("run", "export", "buggy", "--format", "csv", *overrides, cwd=tmp_path, check=False)
    assert wrong.returncode == 2 and "choose one of jsonl, parquet" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    assert attempts and set(attempts) == {1}, f"a refused request is not retried: attempts {attempts}"

    # The dashboard's run view says why, what to change, and links to a failing transcript.
    from tests.test_monitor import read_as, view

    page = view("runs", user_stack.settings, run="buggy")
    assert "Why episodes failed" in [header.value for header in page.subheader]
    source = " ".join(str(markdown.value) for markdown in page.markdown)
    shown = read_as(source)  # text from the ledger is escaped, never markup: read it as rendered
    assert "TaskTimedOut: respond did not return within 2 s" in shown, shown
    assert "./transcripts?run=buggy&episode=" in source and "raise the Environment's turn_timeout_s" in shown


@pytest.mark.timeout(900)
def test_two_policies_on_two_base_models_train_each_on_its_own_model(
    user_stack: UserStack, tmp_path: Path, models_dir: Path
) -> None:
    from transformers import AutoTokenizer

    from rollout.engines.models import SMOLLM2, TINY_QWEN3, resolve
    from rollout.records.checkpoints import CheckpointRecord
    from rollout.records.serving import ServingAck, ServingTarget

    project, overrides = tmp_path / "project", user_stack.overrides
    project.mkdir()
    (project / "two_models.py").write_text(TWO_MODELS)
    micro = ["--preset", "cpu-micro", "trainer.steps=2", *overrides]
    # A policy naming a model rollout does not know: one line naming the setting, before any run starts.
    unknown = rollout(
        "train",
        "two_models:environment",
        *micro,
        "policies.teller.model=gpt-9",
        "--run",
        "no",
        cwd=project,
        check=False,
    )
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr, unknown.stderr
    assert "policies.teller.model=gpt-9 names no model rollout knows" in unknown.stderr
    assert "no" not in runs(overrides, user_stack.elsewhere)

    # asker on the stack's tiny-qwen3 with a LoRA rank of its own, teller on SmolLM2 (the environment's).
    trained = rollout(
        "train",
        "two_models:environment",
        *micro,
        "policies.asker.lora_rank=4",
        "--run",
        "duo",
        cwd=project,
        timeout=900,
    )
    assert "run duo: training asker on tiny-qwen3, teller on smollm2 for 2 steps" in trained.stderr

    async def read(ledger: Ledger) -> tuple[list[Any], ...]:
        turns = await run_turns(ledger, "duo")
        checkpoints = [
            CheckpointRecord.from_payload(e.payload)
            for policy in ("asker", "teller")
            for e in await read_all(ledger, policy_checkpoints_stream(run_policy("duo", policy)))
            if e.kind == Kind.CHECKPOINT_CREATED
        ]
        targets = [ServingTarget.from_payload(e.payload) for e in await read_all(ledger, SERVING_TARGETS)]
        acks = [ServingAck.from_payload(e.payload) for e in await read_all(ledger, SERVING_ACKS)]
        return turns, checkpoints, targets, acks

    turns, checkpoints, targets, acks = ledger_read(user_stack.settings, read)
    # Each policy's turns were rendered with its own model's tokenizer and chat template.
    qwen3 = AutoTokenizer.from_pretrained(resolve(TINY_QWEN3, models_dir))
    smollm2 = AutoTokenizer.from_pretrained(resolve(SMOLLM2, models_dir))
    by_agent = {"asker": qwen3, "teller": smollm2}
    assert {t.payload["agent"] for t in turns} == {"asker", "teller"}
    for turn in turns:
        agent = turn.payload["agent"]
        own, other = by_agent[agent], by_agent["teller" if agent == "asker" else "asker"]
        prompt = list(turn.payload["prompt_ids_delta"])
        assert f", {agent}." in own.decode(prompt), "rendered by its own model's tokenizer"
        assert f", {agent}." not in other.decode(prompt)
    # Two checkpoints per policy, each trained from its own model.
    assert sorted((c.policy.rpartition("/")[2], c.version) for c in checkpoints) == [
        ("asker", 1),
        ("asker", 2),
        ("teller", 1),
        ("teller", 2),
    ]
    models = {t.policy.rpartition("/")[2]: t.model for t in targets if t.run == "duo"}
    assert models == {"asker": "tiny-qwen3", "teller": "smollm2"}
    # Each engine serves only its own model's policy: SmolLM2's the teller's, tiny-qwen3's the asker's.
    served = {
        (a.model, s.policy.rpartition("/")[2]) for a in acks for s in a.serving if s.policy.startswith("duo/")
    }
    assert served == {("tiny-qwen3", "asker"), ("smollm2", "teller")}, served
    status = json.loads(rollout("status", "--json", *overrides, cwd=user_stack.elsewhere, check=False).stdout)
    engine = next(s for s in status["services"] if s["name"] == "engine-smollm2")
    assert engine["healthy"] and engine["detail"].startswith("smollm2 for its policies")
    # Each policy's curves, side by side: a line each in `run status`.
    said = rollout("run", "status", "duo", *overrides, cwd=user_stack.elsewhere).stdout
    lines = {line.split()[0]: line for line in said.splitlines() if line.startswith("  ")}
    assert "2 steps · reward" in lines["asker"] and "2 steps · reward" in lines["teller"], said


def test_a_user_environment_trains_from_its_folder_and_a_killed_train_is_reattached(
    user_stack: UserStack, tmp_path: Path, mlflow_server: str, otlp_receiver: OtlpReceiver
) -> None:
    project, elsewhere = tmp_path / "project", user_stack.elsewhere
    project.mkdir()
    (project / "my_env.py").write_text(MY_ENV)
    (project / "runner_cannot_import.py").write_text(RUNNER_CANNOT_IMPORT)
    overrides = user_stack.overrides
    micro = ["--preset", "cpu-micro", *overrides, "trainer.steps=3"]  # the last value given wins
    # Tracked to W&B (offline) and a real MLflow server, traced to an OTLP receiver: through `down`, `up` and
    # `attach`, each step lands once.
    tracked = [
        "tracking.backends=[wandb,mlflow]",
        "tracking.wandb.mode=offline",
        f"tracking.mlflow.tracking_uri={mlflow_server}",
        "tracking.mlflow.experiment=reattached",
        f"tracking.otlp_endpoint={otlp_receiver.url}",
    ]
    settings = user_stack.settings
    # A runner that cannot import the environment: one paragraph, no traceback, and no run left behind.
    refused = rollout(
        "train", "runner_cannot_import:environment", *micro, "--run", "refused", cwd=project, check=False
    )
    assert refused.returncode == 2, refused.stderr
    assert "a runner cannot load runner_cannot_import:environment" in refused.stderr
    assert "only the user's machine has" in refused.stderr and "Traceback" not in refused.stderr
    assert "refused" not in runs(overrides, elsewhere)

    # The user's environment trains from its folder; output is not a terminal, so progress comes as lines.
    log = (tmp_path / "train.log").open("w")
    train = subprocess.Popen(
        [ROLLOUT, "train", "my_env:environment", *micro, *tracked, "--run", "mine"],
        cwd=project,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while (row := runs(overrides, elsewhere).get("mine")) is None or row["episodes_finished"] < 1:
        assert train.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no episode within 5 minutes"
        time.sleep(1)

    # Mid-run (paused), `run list` and `run status` say what the ledger holds. A pause stops new groups, not
    # the trainer: a step on groups already played may still land, so they are read until they hold still.
    rollout("run", "pause", "mine", *overrides, cwd=elsewhere)
    deadline = time.monotonic() + 120
    while True:
        time.sleep(3)  # turns admitted before the pause finish their episodes
        status = json.loads(rollout("run", "status", "mine", "--json", *overrides, cwd=elsewhere).stdout)
        listed = runs(overrides, elsewhere)["mine"]
        again = json.loads(rollout("run", "status", "mine", "--json", *overrides, cwd=elsewhere).stdout)
        if again == status or time.monotonic() > deadline:
            break
    assert status["state"] == "paused" and status["environment"] == "my_env:environment"
    assert status["episodes_finished"] == episodes_in_ledger(settings, "mine") > 0
    assert status["max_lag"] == 1 and status["steps"] < 3
    assert listed["episodes_finished"] == status["episodes_finished"]
    assert listed["steps"] == status["steps"]
    assert [b["backend"] for b in status["tracking"]["backends"]] == ["wandb", "mlflow", "otlp"], status[
        "tracking"
    ]
    stack_status = json.loads(rollout("status", "--json", *overrides, cwd=elsewhere).stdout)
    assert "mine" in [feed["run"] for feed in stack_status["tracking"]], stack_status["tracking"]

    # The user stops the stack on purpose. `rollout train`, following the paused run, says so and how to go
    # on, and exits (no traceback, no raw Temporal warnings).
    down = rollout("down", *overrides, cwd=elsewhere)
    assert "Traceback" not in down.stderr
    try:
        train.wait(timeout=60)
    except subprocess.TimeoutExpired:
        train.kill()
        raise AssertionError("`rollout train` kept following a stack stopped on purpose") from None
    log.close()
    printed = (tmp_path / "train.log").read_text()
    assert train.returncode == 1, printed[-3000:]
    assert "the stack was stopped (`rollout down`)" in printed and "rollout run attach mine" in printed
    assert "Traceback" not in printed and " WARN " not in printed, printed[-3000:]
    assert "run mine: training tiny-qwen3 for 3 steps" in printed
    assert "episodes played" in printed or "step 1 · reward" in printed  # plain progress lines

    # `rollout up` on the defaults serves another model (SmolLM2): resuming the run there would never sample,
    # so resume refuses and names attach; attach brings the engine, gateway and trainer to the run's recorded
    # settings (tiny-qwen3 with LoRA), resumes the run and follows it to the end.
    plain = [o for o in overrides if not o.startswith("preset=")]
    rollout("up", *plain, cwd=elsewhere, timeout=600)
    refused = rollout("run", "resume", "mine", *plain, cwd=elsewhere, check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "trains tiny-qwen3, but the stack's engine serves" in refused.stderr
    assert "`rollout run attach mine`" in refused.stderr
    assert runs(plain, elsewhere)["mine"]["state"] == "paused", "a refused resume leaves the run paused"

    attached = rollout("run", "attach", "mine", "--json", *plain, cwd=elsewhere, timeout=600)
    summary = json.loads(attached.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and set(summary["served"]) == set(summary["checkpoints"])
    assert summary["episodes"] > 0 and summary["episodes_failed"] == 0
    assert runs(overrides, elsewhere)["mine"]["state"] == "finished"
    # The run's feed logged every step once to both, in one W&B run and one MLflow run, then ended.
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("reattached")
    assert experiment is not None, "the feed made the experiment"
    [tracked_run] = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`rollout.run` = 'mine'"
    )
    wait_until(
        lambda: tracked_run_over(client, tracked_run.info.run_id), 120, "the feed to end after the run"
    )
    assert [m.step for m in client.get_metric_history(tracked_run.info.run_id, "train/step")] == [1, 2, 3]
    assert tracked_run.data.params["trainer.steps"] == "3" and tracked_run.data.params["environment"] == (
        "my_env:environment"
    )
    logs = user_stack.data / "tracking" / "wandb-files"
    in_wandb = [r["train/step"] for r in history(logs, wandb_run_id("mine")) if "train/step" in r]
    assert in_wandb == [1, 2, 3], in_wandb
    # Each step's trace and each episode's, exported once across the restart.
    roots = [s for s in otlp_receiver.of_run("mine") if s.parent_id is None]
    assert sorted(s.name for s in roots if s.name.startswith("step ")) == ["step 1", "step 2", "step 3"], (
        roots
    )
    assert {step_trace_id("mine", "default", n) for n in (1, 2, 3)} <= {s.trace_id for s in roots}
    episodes = [s for s in roots if s.name == "episode"]
    assert len(episodes) == len({s.trace_id for s in episodes}) == episodes_in_ledger(settings, "mine")
    final = json.loads(rollout("run", "status", "mine", "--json", *plain, cwd=elsewhere).stdout)["tracking"]
    assert all(b["ok"] for b in final["backends"]) and "wandb" in final["said"], final
    sandboxes = read_pid_file(user_stack.data / "run" / "sandboxes-shell-my-env.pid")
    assert sandboxes is not None, "the stack serves the sandboxes the run's episodes claim"
    data = user_stack.data.resolve()
    assert sandbox_workdir(data, "shell#my-env", "stack-7").is_dir(), "2 groups of 4: 8"
    services = json.loads(rollout("status", "--json", *plain, cwd=elsewhere, check=False).stdout)
    shown = next(s for s in services["services"] if s["name"] == "sandboxes-shell-my-env")
    assert shown["healthy"] and shown["detail"].startswith("8 sandbox(es)")
    trainer = next(s for s in services["services"] if s["name"] == "trainer")
    assert trainer["detail"].startswith("trains tiny-qwen3"), "the model it trains, not the settings' default"
    # Each service wrote its part of the run as its own writer kind's login, none as the all-writing worker.
    with psycopg.connect(settings.ledger_url) as owner:
        logins = {
            u
            for (u,) in owner.execute(
                "SELECT DISTINCT usename FROM pg_stat_activity WHERE usename LIKE 'rollout%'"
            )
        }
    assert {"rollout_gateway", "rollout_runner", "rollout_trainer", "rollout_serving"} <= logins, logins
    assert "rollout_worker" not in logins, logins

    # The module's last test: `down` stops every service the stack runs, the sandboxes `train` started
    # included.
    stopped = rollout("down", *overrides, cwd=elsewhere).stdout
    for service in ("sandboxes-shell-my-env", "runner", "gateway", "engine", "temporal", "postgres"):
        assert service in stopped, stopped
    assert read_pid_file(user_stack.data / "run" / "sandboxes-shell-my-env.pid") is None, "down stops them"
