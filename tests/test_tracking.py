"""A run's records in W&B and MLflow, each once, from the ledger (rollout.tracking), with the real libraries:
W&B offline (its files read back), MLflow's local store and a real `mlflow server` on loopback.

- A run trained on the session stack with tracking on: its run's feed (the runner's `feed_tracking`
  activity, started by the run) logged each step, each eval of its checkpoints and a table of samples per
  step to both, once, with the run's config, and ended after the run.
- The process that feeds is SIGKILLed twice mid-feed: afterwards every record is in each backend exactly once.
- A backend that refuses (nothing listens at its URI) is reported with its setting and retried after a
  back-off, while the other logs everything; bad tracking settings are refused in one line naming them.
- The run's traces reach an OTLP receiver on loopback built on OpenTelemetry's own message classes: each
  episode's spans (episode → seat → turn → gateway, engine) and each step's (step → train, bridge, serving),
  parented and nested in time, each once, again none after a restarted feed; a collector that refuses is
  reported with `tracking.otlp_endpoint` and what it answered.
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
from rollout.tracking.otlp_sink import OtlpSink
from rollout.tracking.spans import episode_trace_id, span_id, step_trace_id
from rollout.tracking.traces import EPISODES_STREAM, TraceReader
from rollout.tracking.wandb_files import history, records, run_files
from rollout.tracking.wandb_sink import WandbSink, wandb_run_id
from rollout.workflows.tracking_types import MlflowSpec, OtlpSpec, TrackingInput, WandbSpec
from rollout_testing.otlp_receiver import OtlpReceiver, ReceivedSpan

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
    expected = {"train": [1, 2, 3, 4], "samples": [3, 4]}
    for _ in range(100):  # W&B's service may still be writing its transaction log when `finish` returns
        if wandb_steps(tmp_path, "refused") == expected:
            break
        time.sleep(0.1)
    assert wandb_steps(tmp_path, "refused") == expected


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
        ("tracking.otlp_endpoint=grpc://collector:4317", "is not an OTLP/HTTP endpoint"),
        ("tracking.otlp_endpoint=http://me:key@collector:4318", "set OTEL_EXPORTER_OTLP_HEADERS"),
    ],
)
def test_bad_tracking_settings_are_refused_in_one_line_naming_them(override: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load(["data_dir=/tmp/unused", "models_dir=/tmp/unused", override])
    assert said in str(refused.value) and "\n" not in str(refused.value)


def traces(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    by_trace: dict[str, list[ReceivedSpan]] = {}
    for received in spans:
        by_trace.setdefault(received.trace_id, []).append(received)
    return by_trace


def assert_nested(trace: list[ReceivedSpan]) -> None:
    """One root; every other span's parent is in the trace and holds it in time."""
    by_id = {s.span_id: s for s in trace}
    assert len(by_id) == len(trace), "each span once"
    assert len([s for s in trace if s.parent_id is None]) == 1, trace
    for child in trace:
        if child.parent_id is not None:
            parent = by_id[child.parent_id]
            assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns, (parent, child)


def test_a_tracked_runs_episode_and_step_traces_reach_an_otlp_receiver_parented(
    trained_run: str, ledger_url: str, otlp_receiver: OtlpReceiver
) -> None:
    received = traces(otlp_receiver.of_run(trained_run))
    episodes = asyncio.run(ended_episodes(ledger_url, trained_run))
    assert episodes and all(episode_trace_id(trained_run, e) in received for e in episodes), received.keys()
    trace_id = episode_trace_id(trained_run, episodes[0])
    trace = received[trace_id]
    assert_nested(trace)
    names = {s.name for s in trace}
    assert {"episode", "gateway render", "engine sample"} <= names, names
    by_id = {s.span_id: s for s in trace}
    turn = next(s for s in trace if s.name.startswith("turn "))
    seat = by_id[turn.parent_id or ""]
    assert seat.name.startswith("seat ") and by_id[seat.parent_id or ""].name == "episode"
    assert turn.span_id == span_id(trace_id, f"seat/{seat.attributes['rollout.agent']}/turn/0")
    assert turn.attributes["gen_ai.usage.input_tokens"] > 0 and "gen_ai.usage.cache_read.input_tokens" in (
        turn.attributes
    ), turn.attributes
    engine = next(s for s in trace if s.name == "engine sample" and s.parent_id == turn.span_id)
    assert (
        engine.end_ns > engine.start_ns
        and engine.attributes["rollout.engine"] == turn.attributes["rollout.engine"]
    )
    for step in (1, 2):
        step_trace = received[step_trace_id(trained_run, "default", step)]
        assert_nested(step_trace)
        assert {"train", "serving"} <= {s.name for s in step_trace}, step_trace
        assert any(s.name.startswith("serve ") for s in step_trace), step_trace


async def ended_episodes(ledger_url: str, run: str) -> list[str]:
    from rollout.ledger import Ledger
    from rollout.ledger.payloads import episode_ended
    from rollout.ledger.queries import read_all
    from rollout.ledger.streams import run_episodes_stream

    async with await Ledger.connect(ledger_url) as ledger:
        events = await read_all(ledger, run_episodes_stream(run))
    return [ended.episode for e in events if (ended := episode_ended(e)) is not None]


def test_an_otlp_feed_restarted_part_way_exports_each_span_once_and_a_refusal_names_its_setting(
    trained_run: str, ledger_url: str, tmp_path: Path
) -> None:
    from rollout.ledger import Ledger

    given = TrackingInput(trained_run, policies=["default"], otlp=OtlpSpec("unused"))

    async def feed_once(url: str, cut: int | None, directory: Path = tmp_path) -> Feed:
        """A fresh feed (as after a restart) from the positions under `directory`: `cut` entries at most."""
        feed = Feed(
            trained_run, [("otlp", OtlpSink.setting, lambda: OtlpSink(trained_run, OtlpSpec(url), directory))]
        )
        await feed.push([])  # opens it: its positions are read back
        async with await Ledger.connect(ledger_url) as ledger:
            read = await TraceReader(given).read(ledger, feed.held("otlp") or {}, release=True)
        await feed.push(read[:cut])
        await feed.close(final=cut is None)
        return feed

    receiver = OtlpReceiver().start()
    try:
        first = asyncio.run(feed_once(receiver.url, 2))
        assert first.state().backends[0].logged == 2
        asyncio.run(feed_once(receiver.url, None))
        again = asyncio.run(feed_once(receiver.url, None))
        assert again.state().backends[0].logged == 0, "a restarted feed finds every trace exported"
        ids = [s.span_id for s in receiver.of_run(trained_run)]
        assert len(ids) == len(set(ids)) and len(traces(receiver.of_run(trained_run))) >= 4, ids
    finally:
        receiver.stop()

    refusing = OtlpReceiver(refuse=400).start()
    try:
        feed = asyncio.run(feed_once(refusing.url, None, tmp_path / "refused"))
        [state] = feed.state().backends
        assert not state.ok and state.setting == "tracking.otlp_endpoint" and state.retry_in_s, state
        assert state.error is not None and "code: 400, reason: Bad Request" in state.error, state
        assert refusing.requests == 1, "a refusal is not retried within the call: the feed retries later"
    finally:
        refusing.stop()
    held = OtlpSink(trained_run, OtlpSpec("x"), tmp_path / "refused").positions(set())
    assert EPISODES_STREAM not in held, "nothing the collector refused is counted as held"


def test_a_turns_timings_any_ledger_writer_chose_never_stop_its_trace() -> None:
    from datetime import UTC, datetime

    from rollout.ledger.payloads import SampledTurn
    from rollout.tracking.traces import _turn_spans

    at = datetime(2026, 12, 6, tzinfo=UTC)
    forged = {"render_s": 1e308, "sample_s": float("inf"), "compute_s": float("nan")}
    forged |= {f"t{n}": 1.0 for n in range(1000)}
    turn = SampledTurn(
        turn_index=0,
        segment_id="s",
        prompt_prefix_len=0,
        prompt_ids_delta=(1,),
        completion_ids=(2,),
        completion_logprobs=(-0.1,),
        checkpoint="base",
        finish_reason="stop",
        reply={},
        n_messages=1,
        messages_sha="m",
        tools_sha="t",
        timings=forged,
    )
    whole, gateway, engine = _turn_spans("0" * 32, "seat/a", turn, at)
    assert whole.start == whole.end == at and gateway.end == engine.start == at
    assert len(engine.attributes) <= 9, "a few of its timings, never a thousand"
