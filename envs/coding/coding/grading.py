"""A repository in a `shell` sandbox: laying it out, reading it back, and grading it with hidden tests there.

Contract:
- Each function works in the sandbox's working directory, or in `folder` inside it (a seat's own copy of the
  repository, when several agents share one sandbox).
- `lay_out(box, files, clear=...)` writes `files` (path -> text or bytes, relative paths without `..`) into the
  sandbox's working directory, as a gzipped tar sent in base64 pieces of at most `PIECE_CHARS` (a command line
  stays far below the kernel's limit on one argument); `clear` empties the directory first. More than
  `MAX_UPLOAD_BYTES` compressed raises `RepositoryTooLarge`.
- `read_back(box)` answers the working directory's files (no `__pycache__`, no `.git`). It travels in one
  answer of the sandbox, so a repository whose archive does not fit raises `RepositoryTooLarge`.
- `grade(box, task)` writes the runner (`coding/hidden_runner.py`) and the hidden tests into a fresh
  temporary directory outside the working directory, runs them against it (each test at most
  `hidden_runner.PER_TEST_S`, all of them at most `GRADE_TIMEOUT_S`), deletes that directory and answers a
  `Grade`. The repository's `__pycache__` folders are deleted first and none are written (one the agent's own
  runs left behind may be stale: an edit that keeps a file's size within the same second). Only the task's
  own test names count, a test that did not report passing failed, and a result without this grading's nonce
  counts as nothing passing. The hidden tests exist in the sandbox only while they run, after the agent's
  last action.
- A sandbox action the world rejects raises `SandboxActionError`; a lost claim `SandboxSuperseded`.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import shlex
import tarfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePosixPath

from coding.tasks import CodingTask
from rollout.sandbox import SandboxClient
from rollout.sandbox.client import SandboxActionError

PIECE_CHARS = 64 * 1024
MAX_UPLOAD_BYTES = 4 * 1024 * 1024
GRADE_TIMEOUT_S = 60.0
PYTHON = "python3"  # the sandbox host's interpreter: the tasks are plain Python 3
SKIPPED_FOLDERS = frozenset({"__pycache__", ".git"})


class RepositoryTooLarge(ValueError):
    """A repository too big to move through the sandbox's commands."""


@dataclass(frozen=True)
class Grade:
    tests: tuple[str, ...]  # every hidden test, `Class.test_name`
    passed: tuple[str, ...]
    failed: dict[str, str] = field(default_factory=dict[str, str])  # test -> why
    error: str = ""  # what stopped the tests as a whole (an import error, a crash, a time limit)

    @property
    def reward(self) -> float:
        return len(self.passed) / len(self.tests)

    def summary(self) -> str:
        lines = [f"Hidden tests: {len(self.passed)} of {len(self.tests)} passed."]
        if self.error:
            lines.append(self.error)
        lines.extend(
            f"FAILED {name}: {self.failed.get(name, 'did not pass')}" for name in self.failed_tests()
        )
        return "\n".join(lines)

    def failed_tests(self) -> tuple[str, ...]:
        return tuple(name for name in self.tests if name not in self.passed)


def _archive(files: dict[str, str | bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, content in sorted(files.items()):
            parts = PurePosixPath(path).parts
            if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
                raise ValueError(f"not a relative path inside the repository: {path!r}")
            data = content.encode() if isinstance(content, str) else content
            member = tarfile.TarInfo(path)
            member.size, member.mode = len(data), 0o644
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


async def _run(box: SandboxClient, command: str, timeout_s: float = 30.0) -> str:
    done = await box.act({"command": command, "timeout_s": timeout_s})
    if done["exit_code"] != 0 or done["truncated"]:
        why = "killed at its time limit" if done["timed_out"] else f"exit code {done['exit_code']}"
        raise SandboxActionError(f"a sandbox command failed ({why}): {done['output'][-500:]}")
    return done["output"]


def _inside(folder: str) -> str:
    """The shell prefix that makes `folder` (relative to the sandbox's working directory) the current one."""
    if not folder:
        return ""
    parts = PurePosixPath(folder).parts
    if PurePosixPath(folder).is_absolute() or ".." in parts:
        raise ValueError(f"not a folder inside the sandbox's working directory: {folder!r}")
    return f"mkdir -p {shlex.quote(folder)} && cd {shlex.quote(folder)} && "


async def lay_out(
    box: SandboxClient, files: dict[str, str | bytes], *, clear: bool, folder: str = ""
) -> None:
    encoded = base64.b64encode(_archive(files)).decode()
    if len(encoded) > MAX_UPLOAD_BYTES:
        raise RepositoryTooLarge(f"the repository is {len(encoded)} bytes packed, over {MAX_UPLOAD_BYTES}")
    prefix = _inside(folder) + ("find . -mindepth 1 -delete && " if clear else "")
    pieces = [encoded[start : start + PIECE_CHARS] for start in range(0, len(encoded), PIECE_CHARS)]
    if len(pieces) == 1:
        await _run(box, f"{prefix}printf %s {pieces[0]} | base64 -d | tar xzf -")
        return
    upload = (await _run(box, "mktemp")).strip()
    for piece in pieces:
        await _run(box, f"printf %s {piece} >> {shlex.quote(upload)}")
    await _run(box, f"{prefix}base64 -d {shlex.quote(upload)} | tar xzf - ; rm -f {shlex.quote(upload)}")


async def read_back(box: SandboxClient, *, folder: str = "") -> dict[str, bytes]:
    excluded = " ".join(f"--exclude={name}" for name in sorted(SKIPPED_FOLDERS))
    command = f"{_inside(folder)}tar czf - {excluded} . | base64 -w0"
    done = await box.act({"command": command, "timeout_s": 30.0})
    if done["truncated"]:
        raise RepositoryTooLarge("the sandbox's repository does not fit in one answer of the sandbox")
    if done["exit_code"] != 0:
        raise SandboxActionError(f"reading the repository failed: {done['output'][-500:]}")
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(done["output"])), mode="r:gz") as archive:
        for member in archive.getmembers():
            path = PurePosixPath(member.name)
            extracted = archive.extractfile(member) if member.isfile() else None
            if extracted is not None and not path.is_absolute() and ".." not in path.parts:
                files[str(path)] = extracted.read()
    return files


def _grading_command(task: CodingTask, nonce: str) -> str:
    runner = resources.files("coding").joinpath("hidden_runner.py").read_bytes()
    runner_b64 = base64.b64encode(runner).decode()
    tests_b64 = base64.b64encode(task.hidden_tests.encode()).decode()
    limit = int(GRADE_TIMEOUT_S) - 5  # the runner is killed first, so the clean-up below still runs
    return (
        'repository="$PWD"; scratch="$(mktemp -d)" || exit 1; trap \'rm -rf "$scratch"\' EXIT; '
        "find . -name __pycache__ -type d -prune -exec rm -rf {} + ; "
        f'printf %s {runner_b64} | base64 -d > "$scratch/runner.py"; '
        f'printf %s {tests_b64} | base64 -d > "$scratch/hidden_tests.py"; '
        f"ROLLOUT_CODING_NONCE={nonce} timeout -s KILL {limit} {PYTHON} -I -B "
        '"$scratch/runner.py" "$repository" "$scratch/hidden_tests.py" "$scratch/result.json" '
        ">/dev/null 2>&1 </dev/null; "
        'echo "runner exit code $?"; cat "$scratch/result.json" 2>/dev/null'
    )


async def grade(box: SandboxClient, task: CodingTask, *, folder: str = "") -> Grade:
    tests = task.hidden_test_names()
    nonce = secrets.token_hex(16)
    command = _inside(folder) + _grading_command(task, nonce)
    done = await box.act({"command": command, "timeout_s": GRADE_TIMEOUT_S})
    status, _, written = str(done["output"]).partition("\n")
    try:
        result = json.loads(written)
    except ValueError:
        return Grade(tests, (), error=f"the hidden tests reported nothing ({status.strip()})")
    if not isinstance(result, dict) or result.get("nonce") != nonce:
        return Grade(tests, (), error="the hidden tests' report was not the runner's")
    passed = tuple(name for name in tests if name in set(result.get("passed", [])))
    failed = {str(name): str(why) for name, why in dict(result.get("failed", {})).items() if name in tests}
    return Grade(tests, passed, failed, error=str(result.get("error", "")))
