"""Secrets come out of text however they appear: tokens by their shape, URL passwords by their place,
registered secrets and secret-named environment variables by their value; a process's output is scrubbed as it
is written, but for what `rollout seat new` hands out."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollout.gateway.seats import seat_token
from rollout.security.bounded_process import run_bounded
from rollout.security.redaction import environment_secrets, redact_url, register_secret, scrub

TOKEN = seat_token(b"k" * 32, "seat/1")
OPERATOR = "ro-" + "ab12" * 12
ENGINE_API_KEY = "re-" + "cd34" * 16


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (
            f"POST http://127.0.0.1:8000/s/{TOKEN}/v1/chat/completions 401",
            "POST http://127.0.0.1:8000/s/***/v1",
        ),
        (f"Authorization: Bearer {TOKEN}", "Authorization: Bearer ***"),
        (f"x-api-key={TOKEN}&again={TOKEN}", "x-api-key=***&again=***"),
        (f"operator key {OPERATOR} refused", "operator key *** refused"),
        (f"authorization: Bearer {ENGINE_API_KEY}", "authorization: Bearer ***"),
        ("postgresql://postgres:s3cr3t-pw@db:5432/rollout", "postgresql://postgres:***@db:5432/rollout"),
        ("cannot reach postgres://w:p%40ss@h/x: refused", "cannot reach postgres://w:***@h/x: refused"),
        ("s3://bucket/prefix and http://host:80/path", "s3://bucket/prefix and http://host:80/path"),
        ("no secret here: rs-short and ro-123", "no secret here: rs-short and ro-123"),
        (f"vars-{TOKEN[3:]} and {TOKEN}ff", f"vars-{TOKEN[3:]} and {TOKEN}ff"),  # not whole tokens
    ],
)
def test_token_shapes_and_url_passwords_are_blanked(text: str, kept: str) -> None:
    scrubbed = scrub(text)
    assert scrubbed.startswith(kept)
    assert (TOKEN not in scrubbed and OPERATOR not in scrubbed) or scrubbed == text
    assert ENGINE_API_KEY not in scrubbed
    assert "s3cr3t-pw" not in scrubbed and "p%40ss" not in scrubbed


def test_registered_and_environment_secrets_are_blanked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tk-live-0123456789")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-abcdefghij")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "short")  # too short to blank out everywhere
    monkeypatch.setenv("HOME_DIRECTORY", "/home/someone/long")  # not a secret's name
    register_secret(b"\x01\x02binary-secret-bytes")
    register_secret("gw-secret-value-42")
    text = (
        "tk-live-0123456789 sk-ant-abcdefghij wJalrXUtnFEMI/K7MDENG short /home/someone/long "
        f"{b'\x01\x02binary-secret-bytes'.hex()} gw-secret-value-42"
    )
    assert scrub(text) == "*** *** *** short /home/someone/long *** ***"
    assert "tk-live-0123456789" in environment_secrets()


def test_redact_url_keeps_everything_but_the_password() -> None:
    assert redact_url("postgresql://u:pw@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert redact_url("postgresql://u@db/x") == "postgresql://u@db/x"


def test_a_commands_output_is_scrubbed_but_for_what_it_hands_out() -> None:
    """Through the `rollout` entry point: prints, logging and an uncaught traceback are scrubbed; the
    stream under the scrubbing still writes in clear (what `rollout seat new` uses)."""
    program = textwrap.dedent(
        f"""
        import logging, sys
        from rollout.security.redaction import scrub_process_output, unscrubbed
        scrub_process_output()
        logging.basicConfig(level=logging.INFO, force=True)
        print("printed {TOKEN}")
        logging.getLogger("x").info("logged postgresql://u:hunter2-pw@h/x")
        print("handed {TOKEN}", file=unscrubbed(sys.stdout))
        raise RuntimeError("crashed with {OPERATOR}")
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["printed ***", f"handed {TOKEN}"]
    assert "hunter2-pw" not in done.stderr and "logged postgresql://u:***@h/x" in done.stderr
    assert OPERATOR not in done.stderr and "RuntimeError: crashed with ***" in done.stderr


async def test_a_command_an_agent_runs_inherits_no_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Agents and a model's shell commands read their environment, and what they read reaches the ledger: they
    get ours less its secrets, plus what the caller gives them (a seat's own key)."""
    monkeypatch.setenv("TINKER_API_KEY", "tk-live-0123456789")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG")
    monkeypatch.setenv("PGPASSWORD", "hunter2-hunter2")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-agent.sock")
    monkeypatch.setenv("DATABASE_URL", "postgresql://owner@db/prod")
    monkeypatch.setenv("DEPLOY_PRIVATE_KEY", "-----BEGIN KEY-----")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp.json")
    monkeypatch.setenv("ROLLOUT_HARMLESS", "kept")
    done = await run_bounded(
        ["env"], cwd=tmp_path, env={"OPENAI_API_KEY": TOKEN}, timeout_s=30, max_output_bytes=1 << 20
    )
    seen = dict(line.split("=", 1) for line in done.output.splitlines() if "=" in line)
    assert not {"TINKER_API_KEY", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD"} & set(seen)
    assert not {
        "SSH_AUTH_SOCK",
        "DATABASE_URL",
        "DEPLOY_PRIVATE_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    } & set(seen)
    assert seen["ROLLOUT_HARMLESS"] == "kept" and seen["PATH"] == os.environ["PATH"]
    assert seen["OPENAI_API_KEY"] == TOKEN
