"""A run's records in W&B and MLflow, each once, from the ledger (rollout.tracking), with the real libraries:
W&B offline (its files read back), MLflow's local store and a real `mlflow server` on loopback.

- A run trained on the session stack with tracking on: its run's feed (the runner's `feed_tracking`
  activity, started by the run) logged each step, each eval of its checkpoints and a table of samples per
  step to both, once, with the run's config, and ended after the run.
- The process that feeds is SIGKILLed twice mid-feed: afterwards every record is in each backend exactly once.
- A backend that refuses (nothing listens at its URI) is reported with its setting and retried after a
  back-off, while the other logs everything; bad tracking settings are refused in one line naming them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import wandb
from mlflow import MlflowClient

from rollout.config import ConfigError, load
from rollout.net import free_port
from rollout.tracking.entries import Entry, SampleTable, evals_pending, held_back, in_order
from rollout.tracking.feed import Feed
from rollout.tracking.mlflow_sink import RUN_TAG, MlflowSink
from rollout.tracking.wandb_files import history, records, run_files
from rollout.tracking.wandb_sink import WandbSink, wandb_run_id
from rollout.workflows.tracking_types import MlflowSpec, WandbSpec

ROOT = Path(__file__).resolve().parent.parent


def wandb_steps(directory: Path, run: str) -> dict[str, list[int]]:
    """Each stream's logged steps, in order, across every W&B directory of the run (`STREAM/step`)."""
    logged: dict[str, list[int]] = {}
    for row in history(directory, wandb_run_id(run)):
        for name, value in row.items():
            if name.endswith("/step"):
                logged.setdefault(name.removesuffix("/step"), []).append(int(value))
    return logged


def mlflow_run(client: MlflowClient, run: str) -> Any:
    [found] = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], filter_string=f"tags.`{RUN_TAG}` = '{run}'"
    )
    return found


def mlflow_steps(client: MlflowClient, run_id: str, streams: set[str]) -> dict[str, list[int]]:
    return {s: sorted(int(m.step) for m in client.get_metric_history(run_id, f"{s}/step")) for s in streams}


def test_a_tracked_runs_steps_evals_and_samples_reach_wandb_and_mlflow_once(
    trained_run: str, trained_run_tracking: Path
) -> None:
    logged = wandb_steps(trained_run_tracking / "wandb-files", trained_run)
    assert logged["train"] == [1, 2], logged
    evals = {stream: steps for stream, steps in logged.items() if stream.startswith("eval/")}
    assert len(evals) == 1, logged
    [eval_steps] = evals.values()
    assert logged["samples"] == [1, 2] and eval_steps == sorted(set(eval_steps)), logged
    rows = history(trained_run_tracking / "wandb-files", wandb_run_id(trained_run))
    step_two = next(r for r in rows if r.get("train/step") == 2)
    assert {"train/reward_mean", "train/tokens_trained", "train/episodes"} <= set(step_two), step_two
    table = next(r for r in rows if r.get("samples/step") == 1)
    assert table["samples/table/_type"] == "table-file" and table["samples/table/nrows"] >= 1, table

    client = MlflowClient(f"sqlite:///{trained_run_tracking / 'mlflow' / 'mlflow.db'}")
    found = mlflow_run(client, trained_run)
    assert found.info.status == "FINISHED" and found.data.params["trainer.steps"] == "2", found.data.params
    assert mlflow_steps(client, found.info.run_id, {"train", "samples", *evals}) == logged
    loss = client.get_metric_history(found.info.run_id, "train/reward_mean")
    assert [m.step for m in loss] == [1, 2]
    artifacts = [a.path for a in client.list_artifacts(found.info.run_id, "samples")]
    assert artifacts == ["samples/step-000001.json", "samples/step-000002.json"], artifacts


@pytest.mark.timeout(300)
def test_a_feed_killed_mid_run_leaves_each_record_in_each_backend_once(
    trained_run: str, ledger_url: str, mlflow_server: str, tmp_path: Path
) -> None:
    command = [
        sys.executable,
        "-m",
        "tests.tracking_feeder",
        ledger_url,
        trained_run,
        str(tmp_path),
        mlflow_server,
    ]

    # This process's W&B service (the session's runner fed a run in-process) is named in the environment; a
    # feeder of its own, as a runner has, holds its run only as long as it lives.
    own_wandb = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}

    def feed_until(said: str | None) -> list[str]:
        """Feed; SIGKILL the feeder as soon as it prints a line starting with `said` (None: let it end)."""
        feeder = subprocess.Popen(
            [*command, "0.5" if said else "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=own_wandb,
        )
        assert feeder.stdout is not None
        lines = []
        for line in feeder.stdout:
            lines.append(line.strip())
            if said is not None and line.startswith(said):
                os.killpg(feeder.pid, signal.SIGKILL)
                break
        assert feeder.wait(timeout=120) == (-signal.SIGKILL if said else 0), lines
        # W&B names an offline run's directory by the second it started: a feeder restarted within the same
        # second would find its run "in use" (a real restart waits out Temporal's heartbeat timeout).
        time.sleep(1.1)
        return lines

    first = feed_until("logged wandb samples 1")  # W&B part-way, MLflow not begun
    second = feed_until("logged mlflow")  # W&B finished from where it was; MLflow part-way
    third = feed_until(None)
    assert first[-1].startswith("logged wandb") and second[-1].startswith("logged mlflow"), (first, second)
    # MLflow holds a record once its call returns: no feeder logs one an earlier one logged. W&B's service
    # writes its file behind the calls, so a record it had not written when its feeder was killed is logged
    # again (it is not in the files), and only then: what the backends hold is the test.
    said = [line for line in first + second + third if line.startswith("logged mlflow")]
    assert len(said) == len(set(said)), said
    total = int(third[-1].split()[1])
    in_wandb = wandb_steps(tmp_path, trained_run)
    assert len(run_files(tmp_path, wandb_run_id(trained_run))) == 3, "one offline directory per feeder"
    assert all(steps == sorted(set(steps)) for steps in in_wandb.values()), in_wandb
    client = MlflowClient(mlflow_server)
    in_mlflow = mlflow_steps(client, mlflow_run(client, trained_run).info.run_id, set(in_wandb))
    assert in_mlflow == in_wandb and sum(map(len, in_wandb.values())) == total, (in_mlflow, in_wandb)


def entries(n: int) -> list[Entry]:
    made = [Entry("train", s, f"t{s:03d}", {"loss": 1 / s, "trained": 1.0}) for s in range(1, n + 1)]
    return [*made, Entry("samples", n, f"t{n:03d}", table=SampleTable(("step", "reply"), [[n, "hello"]]))]


def test_a_refusing_backend_is_reported_and_retried_while_the_other_logs(tmp_path: Path) -> None:
    refusing = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    now = [0.0]
    feed = Feed(
        "refused",
        [
            (
                "wandb",
                WandbSink.setting,
                lambda: WandbSink("refused", WandbSpec("p", offline=True), tmp_path, {}),
            ),
            ("mlflow", MlflowSink.setting, lambda: MlflowSink("refused", MlflowSpec(refusing), tmp_path, {})),
        ],
        clock=lambda: now[0],
    )
    asyncio.run(feed.push(entries(3)))
    wandb_state, mlflow_state = feed.state().backends
    assert wandb_state.ok and wandb_state.logged == 4, wandb_state
    assert not mlflow_state.ok and mlflow_state.setting == "tracking.mlflow.tracking_uri", mlflow_state
    assert mlflow_state.error is not None and "Connection refused" in mlflow_state.error, mlflow_state
    assert mlflow_state.retry_in_s == 5.0
    now[0] = 4.0  # before the back-off ends: not tried again
    asyncio.run(feed.push(entries(4)))
    assert feed.state().backends[1].retry_in_s == 1.0 and feed.state().backends[0].logged == 6
    now[0] = 5.0  # tried again, refused again: the back-off doubles
    asyncio.run(feed.push(entries(4)))
    assert feed.state().backends[1].retry_in_s == 10.0, feed.state()
    asyncio.run(feed.close())
    assert wandb_steps(tmp_path, "refused") == {"train": [1, 2, 3, 4], "samples": [3, 4]}


def test_an_eval_that_finished_before_an_earlier_ones_waits_for_it_and_each_stream_goes_in_step_order() -> (
    None
):
    trained = [Entry("train", s, f"t{s}", {"trained": 1.0}) for s in (1, 2, 3)]
    second_first = Entry("eval/smoke/coin", 2, "t4", {"score": 0.5})  # checkpoint 2's eval finished first
    first = Entry("eval/smoke/coin", 1, "t5", {"score": 0.4})
    assert held_back([*trained, second_first], every=1) == trained, "step 2's eval waits for step 1's"
    assert evals_pending([*trained, second_first, first], every=1), "step 3's is due too"
    assert not evals_pending([*trained, second_first, first], every=2), "every second: only step 2's is due"
    both = held_back([*trained, second_first, first], every=1)
    assert [(e.stream, e.step) for e in in_order(both)] == [
        ("train", 1),
        ("train", 2),
        ("train", 3),
        ("eval/smoke/coin", 1),
        ("eval/smoke/coin", 2),
    ]


def test_a_wandb_log_cut_short_reads_back_up_to_its_last_whole_record(tmp_path: Path) -> None:
    run = wandb.init(
        id="cut", project="p", mode="offline", dir=str(tmp_path), settings=wandb.Settings(silent=True)
    )
    for step in range(1, 40):
        run.log({"train/step": step, "train/text": "x" * 3000})  # records that span blocks
    run.finish()
    [log] = run_files(tmp_path, "cut")
    whole = len(list(records(log)))
    log.write_bytes(log.read_bytes()[:-2500])
    assert 0 < len(list(records(log))) < whole
    steps = [row["train/step"] for row in history(tmp_path, "cut")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > 30, steps


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("tracking.backends=[neptune]", "bad value for 'tracking.backends': Invalid value 'neptune'"),
        ("tracking.mlflow.tracking_uri=http://me:secret@mlflow.example", "it holds credentials"),
        ("tracking.mlflow.tracking_uri=ftp://mlflow.example", "is not an MLflow tracking URI"),
        ("tracking.samples_every=-1", "bad value for 'tracking.samples_every'"),
    ],
)
def test_bad_tracking_settings_are_refused_in_one_line_naming_them(override: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load(["data_dir=/tmp/unused", "models_dir=/tmp/unused", override])
    assert said in str(refused.value) and "\n" not in str(refused.value)
