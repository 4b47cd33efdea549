"""A repository in a `shell` sandbox: laying it out, reading it back, and grading a copy of it with hidden
tests.

Contract:
- Each function works in the sandbox's working directory, or in `folder` inside it (a seat's own copy of the
  repository, when several agents share one sandbox).
- `lay_out(box, files, clear=...)` writes `files` (path -> text or bytes, relative paths without `..`) into
  the sandbox's working directory, as a gzipped tar sent in base64 pieces of at most `PIECE_CHARS` (a command
  line stays far below the kernel's limit on one argument); `clear` empties the directory first. More than
  `MAX_UPLOAD_BYTES` compressed raises `RepositoryTooLarge`.
- `read_back(box)` answers the working directory's files (no `__pycache__`, no `.git`, nothing the sandbox's
  user cannot read, no links). It travels in one answer of the sandbox, so a repository whose archive does not
  fit raises `RepositoryTooLarge`; one that cannot be read back at all, `RepositoryUnreadable`. `grade` scores
  either 0: what an agent does to its repository never fails its episode.
- `grade_files(files, task, isolation)` grades a repository (path -> bytes) with the task's hidden tests in a
  grader's jail (`coding.grader.harness`, under `isolation`): on this machine, on a copy that only a jailed
  process holds, after the agent's processes are gone. The hidden tests run outside that jail and every
  assertion is evaluated there, so the agent's code can answer wrongly but cannot forge its report. Only the
  task's own test names count, a test that did not report passing failed; a repository over
  `MAX_GRADED_BYTES`, or a grading past `GRADE_TIMEOUT_S`, passes nothing. A grader that cannot run raises
  `GraderFailed` (the episode fails; it is not scored).
- `grade(box, task, folder=, isolation=)` grades the sandbox's repository: `read_back`, then `grade_files`.
  The hidden tests never enter a sandbox.
- A sandbox action the world rejects raises `SandboxActionError`; a lost claim `SandboxSuperseded`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shlex
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from coding.tasks import CodingTask
from rollout.sandbox import SandboxClient
from rollout.sandbox.client import SandboxActionError
from rollout.security.isolation import SandboxIsolation

PIECE_CHARS = 64 * 1024
MAX_UPLOAD_BYTES = 4 * 1024 * 1024
GRADE_TIMEOUT_S = 120.0
MAX_GRADED_BYTES = 16 * 1024 * 1024
SKIPPED_FOLDERS = frozenset({"__pycache__", ".git"})


class RepositoryTooLarge(ValueError):
    """A repository too big to move through the sandbox's commands."""


class RepositoryUnreadable(ValueError):
    """The sandbox's repository could not be read back (its archive failed or is not one)."""


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
    # What the agent made unreadable (a `chmod 000` folder) is left out, not a reason to read nothing.
    command = f"set -o pipefail; {_inside(folder)}tar czf - --ignore-failed-read {excluded} . 2>/dev/null | base64 -w0"
    done = await box.act({"command": command, "timeout_s": 30.0})
    if done["truncated"]:
        raise RepositoryTooLarge("the sandbox's repository does not fit in one answer of the sandbox")
    if done["exit_code"] != 0:
        raise RepositoryUnreadable(f"reading the repository failed: {done['output'][-500:]}")
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(
            fileobj=io.BytesIO(base64.b64decode(done["output"], validate=True)), mode="r:gz"
        ) as archive:
            for member in archive.getmembers():
                path = PurePosixPath(member.name)
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted is not None and not path.is_absolute() and ".." not in path.parts:
                    files[str(path)] = extracted.read()
    except (ValueError, tarfile.TarError, OSError) as error:
        raise RepositoryUnreadable(f"the repository's archive is unreadable: {error}") from None
    return files


class GraderFailed(RuntimeError):
    """The grader itself failed (no jail could be made on this machine, say): the episode fails, it is not
    scored."""


async def grade_files(files: dict[str, bytes], task: CodingTask, isolation: SandboxIsolation) -> Grade:
    """Grade `files` (a repository) with the task's hidden tests, in a grader's jail
    (`coding.grader.harness`)."""
    tests = task.hidden_test_names()
    if sum(len(content) for content in files.values()) > MAX_GRADED_BYTES:
        return Grade(tests, (), error=f"the repository is over {MAX_GRADED_BYTES} bytes: not graded")
    job = {
        "files": {path: base64.b64encode(content).decode() for path, content in files.items()},
        "hidden_tests": task.hidden_tests,
        "isolation": isolation.value,
    }
    harness = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "coding.grader.harness",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        verdict, errors = await asyncio.wait_for(
            harness.communicate(json.dumps(job).encode()), GRADE_TIMEOUT_S
        )
    except TimeoutError:
        return Grade(tests, (), error=f"the hidden tests ran past {GRADE_TIMEOUT_S:g} s")
    finally:
        if harness.returncode is None:
            harness.kill()
            await harness.wait()
    if harness.returncode != 0:
        raise GraderFailed(f"the grader failed (exit code {harness.returncode}): {errors.decode()[-1500:]}")
    result = json.loads(verdict)
    passed = tuple(name for name in tests if name in set(result["passed"]))
    failed = {str(name): str(why) for name, why in dict(result["failed"]).items() if name in tests}
    return Grade(tests, passed, failed, error=str(result["error"]))


async def grade(
    box: SandboxClient,
    task: CodingTask,
    *,
    folder: str = "",
    isolation: SandboxIsolation = SandboxIsolation.bwrap,
) -> Grade:
    """Grade the repository in the sandbox's working directory (or `folder` in it): a copy of it, read
    back."""
    try:
        files = await read_back(box, folder=folder)
    except (
        RepositoryTooLarge,
        RepositoryUnreadable,
    ) as error:  # the agent's doing: it earns nothing, it fails nothing
        return Grade(task.hidden_test_names(), (), error=f"not graded: {error}")
    return await grade_files(files, task, isolation)
