"""Waits on Temporal that ride out its bad moments (rollout.control.waits), and an eval's episodes in flight
split among its environments (rollout.workflows.evals.eval_lanes). Temporal's errors are its own `RPCError`s;
the end-to-end waits (an eval while the dev server is stopped) are in tests/test_cli_on_one_stack.py."""

from __future__ import annotations

import pytest
from temporalio.service import RPCError, RPCStatusCode

from rollout.config import load
from rollout.control.waits import TemporalAway, patiently, transient
from rollout.workflows.evals import eval_lanes


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (RPCStatusCode.UNAVAILABLE, "context deadline exceeded", True),
        (RPCStatusCode.DEADLINE_EXCEEDED, "", True),
        (RPCStatusCode.CANCELLED, "Timeout expired", True),
        (RPCStatusCode.RESOURCE_EXHAUSTED, "namespace rate limit exceeded", True),
        (RPCStatusCode.UNKNOWN, "http2 error: connection reset", True),
        (RPCStatusCode.INTERNAL, "h2 protocol error: http2 error", True),
        (RPCStatusCode.NOT_FOUND, "Namespace default is not found.", True),
        (RPCStatusCode.NOT_FOUND, "workflow not found for ID: eval/x", False),
        (RPCStatusCode.INVALID_ARGUMENT, "invalid cron", False),
        (RPCStatusCode.INTERNAL, "unexpected nil", False),
        (RPCStatusCode.ALREADY_EXISTS, "workflow execution already started", False),
    ],
)
def test_transient_errors_are_temporal_away_not_an_answer(
    status: RPCStatusCode, message: str, expected: bool
) -> None:
    assert transient(RPCError(message, status, b"")) is expected


async def test_a_wait_rides_out_transient_errors_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rollout.control.waits.FIRST_PAUSE_S", 0.01)
    settings = load(["data_dir=/tmp/rollout-waits"])
    failures = [
        RPCError("Timeout expired", RPCStatusCode.CANCELLED, b""),
        RPCError("", RPCStatusCode.UNAVAILABLE, b""),
    ]
    said: list[str] = []

    async def call() -> str:
        if failures:
            raise failures.pop(0)
        return "scored"

    assert await patiently(call, "the eval's result", settings, report=said.append) == "scored"
    assert said == [
        "waiting for Temporal (the eval's result): cancelled; trying again",
        "waiting for Temporal (the eval's result): unavailable; trying again",
        "",
    ]


async def test_an_answer_is_raised_at_once_and_lasting_trouble_is_one_paragraph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("rollout.control.waits.FIRST_PAUSE_S", 0.01)
    monkeypatch.setattr("rollout.control.waits.MAX_PAUSE_S", 0.02)
    settings = load(["data_dir=/tmp/rollout-waits", "services.temporal.port=7777"])
    calls = 0

    async def not_found() -> None:
        nonlocal calls
        calls += 1
        raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")

    with pytest.raises(RPCError):
        await patiently(not_found, "the eval's result", settings)
    assert calls == 1

    async def away() -> None:
        raise RPCError("http2 error", RPCStatusCode.UNAVAILABLE, b"")

    with pytest.raises(TemporalAway) as raised:
        await patiently(away, "the eval's result", settings, then="Run it again.", window_s=0.2)
    said = str(raised.value)
    assert "Temporal at 127.0.0.1:7777 did not answer while waiting for the eval's result" in said
    assert "/tmp/rollout-waits/logs/temporal.log" in said and said.endswith("Run it again.")
    assert "\n" not in said


@pytest.mark.parametrize(
    ("in_flight", "environments", "lanes"),
    [(4, 3, [2, 1, 1]), (2, 3, [1, 1]), (1, 5, [1]), (8, 2, [4, 4]), (4, 1, [4]), (5, 2, [3, 2])],
)
def test_an_evals_episodes_in_flight_are_split_among_lanes(
    in_flight: int, environments: int, lanes: list[int]
) -> None:
    assert eval_lanes(in_flight, environments) == lanes
    assert sum(lanes) == in_flight
