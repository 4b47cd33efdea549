"""The script that runs a task's hidden tests in the sandbox: stdlib only, copied there at grading time.

    ROLLOUT_CODING_NONCE=... python3 -I hidden_runner.py REPOSITORY HIDDEN_TESTS_FILE RESULT_FILE

Contract:
- Imports the hidden tests from their file (under a module name of its own, so a file of the repository cannot
  stand in for them) with REPOSITORY at the end of `sys.path` (after the standard library: a repository file
  named like a standard module does not replace it), and runs them with unittest, from REPOSITORY.
- Each test gets `PER_TEST_S` seconds; a test still running then fails as timed out.
- Writes `{"nonce", "passed": [name], "failed": {name: reason}, "error"}` to RESULT_FILE, names as
  `Class.test_name`. The nonce comes from the environment and is removed from it before any code of the
  repository runs, so a repository's code cannot easily write a result the grader accepts. A fence against
  accidents and casual tampering, not a security boundary: the sandbox is that.
- What the tests print is captured and dropped; reasons are cut to `REASON_CHARS`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import sys
import traceback
import unittest
from typing import Any

PER_TEST_S = 5.0
REASON_CHARS = 300


class TestTimedOut(BaseException):
    """Raised inside a test that ran past PER_TEST_S (a BaseException: `except Exception` does not swallow it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise TestTimedOut(f"timed out after {PER_TEST_S:g} s")


def _short_name(test: unittest.TestCase) -> str:
    return ".".join(test.id().split(".")[-2:])


def _reason(error: tuple[Any, ...]) -> str:
    kind, value, _ = error
    return f"{kind.__name__}: {value}"[:REASON_CHARS]


class Recorder(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.passed: list[str] = []
        self.reasons: dict[str, str] = {}

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        signal.setitimer(signal.ITIMER_REAL, PER_TEST_S)

    def stopTest(self, test: unittest.TestCase) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        super().stopTest(test)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.passed.append(_short_name(test))

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self.reasons[_short_name(test)] = _reason(err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self.reasons[_short_name(test)] = _reason(err)


def run(repository: str, tests_file: str) -> dict[str, Any]:
    sys.path.append(repository)
    os.chdir(repository)
    spec = importlib.util.spec_from_file_location("rollout_hidden_tests", tests_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    recorder = Recorder()
    signal.signal(signal.SIGALRM, _on_alarm)
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        try:
            signal.setitimer(signal.ITIMER_REAL, PER_TEST_S)
            spec.loader.exec_module(module)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException:  # the repository does not import: every test fails
            signal.setitimer(signal.ITIMER_REAL, 0)
            error = traceback.format_exc(limit=-1).strip().splitlines()[-1]
            return {"passed": [], "failed": {}, "error": f"the tests do not import: {error}"[:REASON_CHARS]}
        unittest.defaultTestLoader.loadTestsFromModule(module).run(recorder)
    return {"passed": recorder.passed, "failed": recorder.reasons, "error": ""}


def main() -> None:
    nonce = os.environ.pop("ROLLOUT_CODING_NONCE", "")
    repository, tests_file, result_file = sys.argv[1:4]
    # Opened before any repository code runs, so the result goes where the grader reads it.
    with open(result_file, "w") as out:
        result = run(repository, tests_file)
        out.write(json.dumps({"nonce": nonce, **result}))


if __name__ == "__main__":
    main()
