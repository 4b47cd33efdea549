"""`rollout engine serve`, `rollout gateway` and `rollout seat new` as a user runs them, with the OpenAI
SDK."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from rollout.config import Settings
from rollout.ledger.streams import seat_stream
from rollout.net import free_port
from rollout.stack.processes import wait_for_http

ROLLOUT = str(Path(sys.executable).parent / "rollout")

pytestmark = pytest.mark.slow


def overrides(settings: Settings, models_dir: Path) -> list[str]:
    return [
        f"data_dir={settings.data_dir}",
        f"services.postgres.port={settings.services.postgres.port}",
        f"models_dir={models_dir}",
    ]


@pytest.fixture
def services(stack_settings: Settings, models_dir: Path, tiny_qwen3: str) -> Iterator[str]:
    engine_port, gateway_port = free_port(), free_port()
    common = overrides(stack_settings, models_dir)
    engine = subprocess.Popen(
        [ROLLOUT, "engine", "serve", "--model", "tiny-qwen3", "--port", str(engine_port), *common]
    )
    gateway = subprocess.Popen(
        [
            ROLLOUT,
            "gateway",
            "--model",
            "tiny-qwen3",
            "--port",
            str(gateway_port),
            "--engine-url",
            f"http://127.0.0.1:{engine_port}",
            *common,
        ]
    )
    try:
        wait_for_http(f"http://127.0.0.1:{engine_port}/health", engine)
        wait_for_http(f"http://127.0.0.1:{gateway_port}/health", gateway)
        yield f"http://127.0.0.1:{gateway_port}"
    finally:
        for process in (gateway, engine):
            process.terminate()
            process.wait(30)


def test_a_hand_made_seat_samples_through_gateway_and_local_engine(
    services: str, stack_settings: Settings, models_dir: Path
) -> None:
    made = subprocess.run(
        [
            ROLLOUT,
            "seat",
            "new",
            "--agent",
            "me",
            "--gateway-url",
            services,
            "--json",
            *overrides(stack_settings, models_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    seat = json.loads(made.stdout)
    client = openai.OpenAI(base_url=seat["base_url"], api_key=seat["api_key"], max_retries=0)
    reply = client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 5
    tail = subprocess.run(
        [ROLLOUT, "ledger", "tail", seat_stream(seat["seat"]), *overrides(stack_settings, models_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    kinds = [json.loads(line)["kind"] for line in tail.stdout.splitlines()]
    assert kinds == ["SeatOpened", "TurnRecorded"]


def test_the_gateway_without_an_engine_says_what_to_start(stack_settings: Settings, models_dir: Path) -> None:
    """With no --engine-url it uses the configured engine; none answers there, so it says what to start, and
    keeps serving (an engine starting beside it, as `rollout up` starts them, is found when it comes)."""
    engine_port = free_port()
    gateway = subprocess.Popen(
        [
            ROLLOUT,
            "gateway",
            "--port",
            str(free_port()),
            *overrides(stack_settings, models_dir),
            f"services.gateway.engine_port={engine_port}",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert gateway.stderr is not None
        said = ""
        for line in gateway.stderr:
            said += line
            if "no engine answers" in line:
                break
        assert f"no engine answers at http://127.0.0.1:{engine_port} yet" in said, said
        assert "rollout engine serve" in said and gateway.poll() is None, "it keeps serving"
    finally:
        gateway.terminate()
        gateway.wait(30)
