"""The trusted side of a grading: runs a task's hidden tests against a copy of the agent's repository that
only a jailed process holds.

    python -m coding.grader.harness < JOB > VERDICT

Contract:
- JOB (JSON on stdin): `files` (path -> base64, the repository as the sandbox gave it back), `hidden_tests`
  (the test module's source) and `isolation` (`bwrap` or `none`, the runner's `sandbox.isolation`).
- The repository is written into a fresh workspace (rollout.sandbox.workspace) and served there by
  `graded_server.py` in a jail of its own (rollout.sandbox.jail, `GRADER_LIMITS`): no network, none of this
  machine's files, its own uid. The hidden tests never enter it: they run here, in this process, where the
  repository's modules are stand-ins (`RepositoryFinder`) whose attributes, calls, lengths and iterations are
  questions to the jailed process. Its answers are data (plain values, or handles to its objects) and every
  assertion is evaluated here, so the graded code can answer wrongly but cannot pass a test it fails: it
  cannot reach this process, its tests, its report or the assertions.
- A repository's exception reaches the tests as a class of this process with the same name and the standard
  bases of its MRO (`assertRaises(ValueError)` and `assertRaises(InsufficientFunds)` both hold); one of a
  class the tests never imported as the nearest standard exception.
- Importing the tests (and the repository's modules they name) gets `IMPORT_S`. Each test gets `PER_TEST_S`
  seconds of the jailed process's time, not counting its start (up to `START_S`,
  until it says it is ready: a loaded host's jail is slow to start); a test still waiting then fails as timed
  out, the process is killed, and the next test gets a fresh one (module attributes the tests imported are
  looked up again by name; objects of the killed process are gone).
- VERDICT (JSON on stdout, this process's own, which the jailed process does not share): `passed` (names),
  `failed` (name -> reason, at most `REASON_CHARS`), `error` (what stopped the tests as a whole).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import importlib.abc
import importlib.machinery
import io
import json
import math
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import types
import unittest
import uuid
from contextlib import redirect_stderr, redirect_stdout
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, cast

from rollout.sandbox.jail import Jail, jail_uid
from rollout.sandbox.workspace import Workspace
from rollout.security.isolation import JailLimits, SandboxIsolation

PER_TEST_S = 5.0
IMPORT_S = 30.0  # the repository's modules imported for the tests: more than a test, on a loaded host
START_S = 60.0  # for the jail and its interpreter to start; a loaded host's, never a test's, time
READY = b'{"ready": true}'
REASON_CHARS = 300
MAX_ANSWER_BYTES = 4 * 1024 * 1024
GRADER_LIMITS = JailLimits(
    processes=16, memory_bytes=512 * 1024 * 1024, cpu_s=120, disk_bytes=64 * 1024 * 1024
)


class TestTimedOut(BaseException):
    """The jailed process did not answer within the test's time (a BaseException: `except Exception` in a test
    does not swallow it)."""


class GradedError(Exception):
    """An exception the graded code raised whose class the tests do not know, nor any standard base of it."""


class GradedProcessLost(Exception):
    """The jailed process died or answered something that is not an answer."""


class Graded:
    """The conversation with the jailed process serving the repository; restarted after a test times out."""

    def __init__(self, jail: Jail) -> None:
        self.jail = jail
        self.generation = 0
        self.deadline = math.inf
        self.allowed_s = PER_TEST_S  # what `deadline` allows, for its timeout's message
        self.exceptions: dict[str, type[BaseException]] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def _start(self) -> None:
        """A fresh jailed process, once it said it is ready: the time it took to start is added to the
        running test's, which counts only the graded code's."""
        started = time.monotonic()
        inside = self.jail.inside
        self._process = self.jail.spawn(
            ["python3", "-I", "-S", "-B", f"{inside}/graded_server.py", f"{inside}/repo"], cwd="repo"
        )
        self._buffer = b""
        self.generation += 1
        try:
            ready = self._line(started + START_S)
        except TestTimedOut:
            raise GradedProcessLost(f"the graded code's process did not start within {START_S:g} s") from None
        if ready != READY:
            self.kill()
            raise GradedProcessLost("the graded code's process did not start")
        self.deadline += time.monotonic() - started

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def ask(self, request: dict[str, Any], path: tuple[str, ...] = ()) -> Any:
        """The jailed process's answer to `request`; `path` names the module attribute asked for, if one
        is."""
        if self._process is None:
            self._start()
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps(request).encode() + b"\n")
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            raise GradedProcessLost("the graded code's process died") from None
        line = self._line(self.deadline)
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            self.kill()
            raise GradedProcessLost("the graded code's process answered something that is not JSON") from None
        if not isinstance(reply, dict):
            self.kill()
            raise GradedProcessLost("the graded code's process answered something that is not an answer")
        if "raised" in reply:
            raised = reply["raised"] if isinstance(reply["raised"], dict) else {}
            raise self._exception(raised.get("mro", []))(str(raised.get("message", "")))
        try:
            return self.decode(reply.get("value"), path)
        except (TypeError, ValueError, KeyError, RecursionError) as error:  # an unhashable key, say
            raise GradedProcessLost(f"an answer that is no value: {error}") from None

    def _line(self, deadline: float) -> bytes:
        """The jailed process's next line, read by `deadline` (TestTimedOut after it, the process killed)."""
        process = self._process
        assert process is not None and process.stdout is not None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise TestTimedOut(f"timed out after {self.allowed_s:g} s")
            ready, _, _ = select.select([process.stdout], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                self.kill()
                raise GradedProcessLost("the graded code's process died")
            self._buffer += chunk
            if len(self._buffer) > MAX_ANSWER_BYTES:
                self.kill()
                raise GradedProcessLost(f"an answer over {MAX_ANSWER_BYTES} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _exception(self, mro: Any) -> type[BaseException]:
        names = [str(name) for name in mro] if isinstance(mro, list) else []
        for name in names:
            if name in self.exceptions:
                return self.exceptions[name]
            standard = _standard_exception(name)
            if standard is not None:
                return standard
        return GradedError

    def exception_class(self, mro: list[str]) -> type[BaseException]:
        """This process's class for the repository's exception class named first in `mro`."""
        name = mro[0]
        if name not in self.exceptions:
            base = next((s for s in map(_standard_exception, mro[1:]) if s is not None), Exception)
            made = type(name.rsplit(".", 1)[-1], (base,), {"__module__": name.rsplit(".", 1)[0]})
            self.exceptions[name] = cast(type[BaseException], made)
        return self.exceptions[name]

    def decode(self, value: Any, path: tuple[str, ...] = ()) -> Any:
        if isinstance(value, list):
            return [self.decode(item) for item in value]
        if not isinstance(value, dict):
            return value
        tag = value.get("$")
        items: Any = value.get("v", [])
        if tag == "handle":
            exception = value.get("exception")
            if isinstance(exception, list) and exception:
                return self.exception_class([str(name) for name in exception])
            return Remote(self, int(value["id"]), self.generation, path, str(value.get("type", "")))
        if tag == "dict":
            return {self.decode(k): self.decode(v) for k, v in items}
        if tag == "bytes":
            return base64.b64decode(items)
        if tag == "float":
            return float(items)
        kinds: dict[str, Any] = {"tuple": tuple, "set": set, "frozenset": frozenset}
        if tag not in kinds or not isinstance(items, list):
            raise GradedProcessLost(f"an answer of no known kind ({tag!r})")
        return kinds[tag](self.decode(item) for item in items)

    def encode(self, value: Any) -> Any:
        if isinstance(value, Remote):
            return {"$": "handle", "id": value.reference()["handle"]}
        if value is None or isinstance(value, bool | str | int):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
        if isinstance(value, list):
            return [self.encode(item) for item in value]
        if isinstance(value, tuple | set | frozenset):
            return {"$": type(value).__name__, "v": [self.encode(item) for item in value]}
        if isinstance(value, dict):
            return {"$": "dict", "v": [[self.encode(k), self.encode(v)] for k, v in value.items()]}
        if isinstance(value, bytes):
            return {"$": "bytes", "v": base64.b64encode(value).decode()}
        raise TypeError(f"a {type(value).__name__} cannot be passed to the graded code")


def _standard_exception(name: str) -> type[BaseException] | None:
    module, _, attribute = name.rpartition(".")
    if module != "builtins":
        return None
    found = getattr(builtins, attribute, None)
    if isinstance(found, type) and issubclass(found, Exception):
        return found
    return None


class Remote:
    """An object of the jailed process. Comparing one is identity: only the values it answers are compared."""

    def __init__(
        self, graded: Graded, handle: int, generation: int, path: tuple[str, ...], kind: str
    ) -> None:
        self._graded, self._handle, self._generation, self._path, self._kind = (
            graded,
            handle,
            generation,
            path,
            kind,
        )

    def reference(self) -> dict[str, Any]:
        if self._generation == self._graded.generation and self._graded._process is not None:
            return {"handle": self._handle}
        if self._path:
            return {"path": list(self._path)}  # the process was replaced: look the attribute up again
        raise GradedProcessLost("an object of the graded code's previous process (it was killed)")

    def _ask(self, op: str, *args: Any, **fields: Any) -> Any:
        graded = self._graded
        request = {"op": op, **self.reference(), "args": [graded.encode(a) for a in args], **fields}
        return graded.ask(request)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("get", name=name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        graded = self._graded
        return self._ask("call", *args, kwargs={k: graded.encode(v) for k, v in kwargs.items()})

    def __len__(self) -> int:
        value = self._ask("len")
        if not isinstance(value, int):
            raise TypeError("the graded code's len() is not an int")
        return value

    def __iter__(self) -> Any:
        items = self._ask("iter")
        return iter(items if isinstance(items, list) else [])

    def __getitem__(self, key: Any) -> Any:
        return self._ask("getitem", key)

    def __contains__(self, item: Any) -> bool:
        return self._ask("contains", item) is True

    def __bool__(self) -> bool:
        return self._ask("bool") is True

    def __str__(self) -> str:
        value = self._ask("str")
        return value if isinstance(value, str) else ""

    def __repr__(self) -> str:
        return f"<graded {self._kind}>"


class RepositoryFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the repository's modules (a top-level name of its files that no standard module has) give
    stand-ins whose attributes are the jailed process's."""

    def __init__(self, graded: Graded, names: set[str]) -> None:
        self.graded, self.names = graded, names

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        graded, name = self.graded, spec.name

        def attribute(attribute: str) -> Any:
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            return graded.ask({"op": "get", "path": [name], "name": attribute}, (name, attribute))

        module.__dict__["__getattr__"] = attribute  # PEP 562: every other name of the module is the jail's
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        self.graded.ask({"op": "bool", "path": [module.__name__]})  # it imports there, or raises as it would


def repository_modules(files: dict[str, bytes]) -> set[str]:
    names = set()
    for path in files:
        top = PurePosixPath(path).parts[0]
        name = top[: -len(".py")] if top.endswith(".py") else top
        if name.isidentifier() and (top.endswith(".py") or len(PurePosixPath(path).parts) > 1):
            names.add(name)
    return names - set(sys.stdlib_module_names) - set(sys.builtin_module_names)


def _short_name(test: unittest.TestCase) -> str:
    return ".".join(test.id().split(".")[-2:])


def _reason(error: tuple[Any, ...]) -> str:
    kind, value, _ = error
    return f"{kind.__name__}: {value}"[:REASON_CHARS]


class Recorder(unittest.TestResult):
    def __init__(self, graded: Graded) -> None:
        super().__init__()
        self.graded = graded
        self.passed: list[str] = []
        self.reasons: dict[str, str] = {}

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self.graded.deadline = time.monotonic() + PER_TEST_S

    def stopTest(self, test: unittest.TestCase) -> None:
        self.graded.deadline = math.inf
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


def run_tests(graded: Graded, names: set[str], hidden_tests: str) -> dict[str, Any]:
    finder = RepositoryFinder(graded, names)
    sys.meta_path.insert(0, finder)
    module = types.ModuleType("rollout_hidden_tests")
    recorder = Recorder(graded)
    captured = io.StringIO()
    try:
        with redirect_stdout(captured), redirect_stderr(captured):
            try:
                graded.deadline, graded.allowed_s = time.monotonic() + IMPORT_S, IMPORT_S
                exec(compile(hidden_tests, "hidden_tests.py", "exec"), module.__dict__)
            except BaseException:  # the repository does not import: every test fails
                error = traceback.format_exc(limit=-1).strip().splitlines()[-1]
                return {
                    "passed": [],
                    "failed": {},
                    "error": f"the tests do not import: {error}"[:REASON_CHARS],
                }
            finally:
                graded.deadline, graded.allowed_s = math.inf, PER_TEST_S
            unittest.defaultTestLoader.loadTestsFromModule(module).run(recorder)
    finally:
        sys.meta_path.remove(finder)
    return {"passed": recorder.passed, "failed": recorder.reasons, "error": ""}


def grade(files: dict[str, bytes], hidden_tests: str, isolation: SandboxIsolation) -> dict[str, Any]:
    root = Path(tempfile.gettempdir()) / f"rollout-{os.getuid()}" / "graders" / uuid.uuid4().hex[:12]
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    workspace = Workspace(root, disk_bytes=GRADER_LIMITS.disk_bytes, owner=jail_uid())
    jail = Jail(workspace, limits=GRADER_LIMITS, isolation=isolation)
    graded = Graded(jail)
    try:
        server = resources.files("coding.grader").joinpath("graded_server.py").read_bytes()
        (workspace.path / "graded_server.py").write_bytes(server)
        for path, content in files.items():
            parts = PurePosixPath(path).parts
            if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
                continue  # read_back keeps none such; a guard all the same
            target = workspace.path.joinpath("repo", *parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        (workspace.path / "repo").mkdir(exist_ok=True)
        workspace.hand_over()
        return run_tests(graded, repository_modules(files), hidden_tests)
    finally:
        graded.kill()
        asyncio.run(jail.close())
        workspace.close()
        shutil.rmtree(root, ignore_errors=True)  # without root there is no tmpfs to unmount: the copy is here


def main() -> None:
    job = json.loads(sys.stdin.read())
    files = {str(path): base64.b64decode(content) for path, content in job["files"].items()}
    verdict = grade(files, str(job["hidden_tests"]), SandboxIsolation(job["isolation"]))
    sys.stdout.write(json.dumps(verdict))


if __name__ == "__main__":
    main()
