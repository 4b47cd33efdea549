"""Typed payloads: each record writes exactly the payload its writer always wrote, and reads it back."""

from __future__ import annotations

import re
from dataclasses import asdict, replace
from datetime import UTC, datetime

import pytest

from rollout.ledger import Kind, RecordedEvent
from rollout.ledger.payloads import (
    AttemptAbandoned,
    EpisodeEnded,
    ExternalTurn,
    SampledTurn,
    episode_ended,
    turn_recorded,
)
from rollout.records.batches import BatchInfo
from rollout.workflows.episode_types import EpisodeRecord, EpisodeResult

SAMPLED = {
    "seat": "r/g000000-0/solver",
    "run": "r",
    "episode": "g000000-0",
    "agent": "solver",
    "policy": "r/default",
    "turn_index": 1,
    "fingerprint": "f" * 64,
    "segment_id": "r/g000000-0/solver/abc",
    "prompt_prefix_len": 7,
    "prompt_ids_delta": [8, 9],
    "completion_ids": [10, 11, 12],
    "completion_logprobs": [-0.5, -0.25, -0.125],
    "checkpoint": "r/default-step000002",
    "checkpoint_version": 2,
    "engine": "local",
    "admitted_newest": 3,
    "admitted_max_lag": 1,
    "finish_reason": "tool_calls",
    "stop_sequence": None,
    "reply": {"role": "assistant", "content": "hi", "tool_calls": []},
    "parse_failures": ["invalid_json"],
    "n_messages": 3,
    "messages_sha": "m",
    "tools_sha": "t",
    "timings": {"render_s": 0.1, "sample_s": 0.2},
}

EXTERNAL = {
    "seat": "r/g000000-0/judge",
    "run": "r",
    "episode": "g000000-0",
    "agent": "judge",
    "policy": "r/judge",
    "turn_index": 0,
    "fingerprint": "e" * 64,
    "external": True,
    "trainable": False,
    "model": "gpt-x",
    "finish_reason": "stop",
    "reply": {"role": "assistant", "content": "fine"},
    "prompt_tokens": 12,
    "completion_tokens": 3,
    "n_messages": 2,
    "messages_sha": "m",
    "tools_sha": "t",
    "timings": {"sample_s": 0.3},
}


def event(kind: str, payload: dict[str, object]) -> RecordedEvent:
    return RecordedEvent(
        stream="s", seq=1, key="k", kind=kind, payload=payload, recorded_at=datetime.now(UTC)
    )


def test_turns_round_trip_in_the_gateways_shapes() -> None:
    sampled = turn_recorded(SAMPLED)
    assert isinstance(sampled, SampledTurn) and sampled.to_payload() == SAMPLED
    assert sampled.completion_ids == (10, 11, 12) and sampled.aborted is None
    aborted = replace(sampled, aborted="client went away")
    assert aborted.to_payload() == {**SAMPLED, "aborted": "client went away"}
    assert turn_recorded(aborted.to_payload()) == aborted
    external = turn_recorded(EXTERNAL)
    assert isinstance(external, ExternalTurn) and external.to_payload() == EXTERNAL


def test_a_turn_recorded_before_later_fields_existed_still_reads() -> None:
    older = {k: v for k, v in SAMPLED.items() if k not in ("stop_sequence", "admitted_newest", "timings")}
    turn = SampledTurn.from_payload({**older, "checkpoint_version": None})
    assert turn.checkpoint_version == 0 and turn.stop_sequence is None and turn.timings == {}


def test_episodes_are_recorded_in_the_runners_shape() -> None:
    result = EpisodeResult(run="r", episode="g000001-0", group=1, finished=True, rewards={"solver": 1.0})
    record = EpisodeRecord(
        result=result,
        environment="env:environment",
        seats={"solver": "seat-1"},
        turns={"solver": 4},
        metrics={"solver": {"steps": 4.0}},
        sandbox="shell/box-0@3",
    )
    written = {
        **asdict(result),
        "environment": record.environment,
        "seats": record.seats,
        "turns": record.turns,
        "metrics": record.metrics,
        "sandbox": record.sandbox,
    }
    finished = EpisodeEnded.from_payload(written)
    assert finished.to_payload() == written
    assert (finished.kind, finished.key) == (Kind.EPISODE_FINISHED, "g000001-0/finished")
    failed = replace(finished, finished=False, error="TaskFailed: boom")
    assert failed.to_payload() == {
        **written,
        "finished": False,
        "error": "TaskFailed: boom",
        "trainable": False,
    }
    assert (failed.kind, failed.key) == (Kind.EPISODE_ABANDONED, "g000001-0/failed")
    assert EpisodeEnded.from_payload(failed.to_payload()) == failed


def test_only_whole_episodes_end_an_episode() -> None:
    attempt = AttemptAbandoned(run="r", episode="g0-0", agent="a", seat="s1", attempt=2, reason="lost")
    assert attempt.to_payload() == {
        "run": "r",
        "episode": "g0-0",
        "agent": "a",
        "seat": "s1",
        "attempt": 2,
        "reason": "lost",
        "trainable": False,
    }
    assert attempt.key == "g0-0/a/attempt/2/abandoned"
    assert AttemptAbandoned.from_payload(attempt.to_payload()) == attempt
    assert episode_ended(event(Kind.EPISODE_ABANDONED, attempt.to_payload())) is None
    whole = EpisodeEnded(run="r", episode="g0-0", group=0, finished=False, environment="e", error="x")
    assert episode_ended(event(Kind.EPISODE_ABANDONED, whole.to_payload())) == whole
    assert episode_ended(event(Kind.TURN_RECORDED, SAMPLED)) is None


def test_a_batch_is_recorded_as_its_fields() -> None:
    info = BatchInfo(
        run="r",
        policy="r/default",
        step=3,
        groups=[4, 5],
        episodes=["g000004-0", "g000005-0"],
        trained_episodes=["g000004-0"],
        skipped_groups=1,
        sampled_tokens=17,
        reward_mean=0.5,
        reward_std=0.25,
    )
    assert info.to_payload() == asdict(info)
    assert BatchInfo.from_payload(info.to_payload()) == info


def test_a_launch_is_read_back_only_as_rollout_writes_one() -> None:
    """`rollout run attach` starts processes with a run's launch record: a forged one (a setting that points a
    service elsewhere, a relative import path, a control character) is refused where it is read."""
    from rollout.config import load
    from rollout.config.overrides import overrides_for, setting_given
    from rollout.run.launches import LAUNCH_SECTIONS, RunLaunch

    settings = load(
        [
            *("trainer.model=/models/my model", "gpu.mode=shared", "services.gateway.model=/models/my model"),
            *("trainer.loss=truncated_is", "trainer.loss_params.is_cap=1e9"),  # a loss's own parameters too
        ]
    )
    written = RunLaunch("r", "pkg.env:environment", overrides_for(settings, *LAUNCH_SECTIONS), ["/work/envs"])
    read = RunLaunch.from_payload(written.to_payload())
    assert read == written and read.model == "/models/my model"
    again = load(read.overrides)
    assert (again.trainer, again.gpu, again.gpu_lease) == (settings.trainer, settings.gpu, "0")
    assert again.trainer.loss_params == {"is_cap": 1e9}
    assert setting_given(read.overrides, "services.gateway.model") == "/models/my model"
    for forged, said in [
        ({"overrides": ["services.postgres.url=postgresql://evil@10.0.0.1/x"]}, "services.postgres.url"),
        ({"overrides": ["data_dir=/tmp/elsewhere"]}, "data_dir"),
        ({"overrides": ["trainer.model"]}, "trainer.model"),
        ({"overrides": ["trainer.loss_params.a.b=1"]}, "trainer.loss_params.a.b"),
        ({"overrides": ["trainer.model=x\nservices.postgres.url=y"]}, "control character"),
        ({"import_path": ["envs"]}, "absolute"),
        ({"import_path": ["/ok\x00/no"]}, "absolute"),
    ]:
        with pytest.raises(ValueError, match=re.escape(said)):
            RunLaunch.from_payload(written.to_payload() | forged)
