"""The graded side of a grading: stdlib only, run in the grader's jail on a copy of the agent's repository.

    python3 -I -S -B graded_server.py REPOSITORY

Contract:
- Says `{"ready": true}` once started, before anything of the repository runs. Then serves the grader's
  requests, one JSON object per line on stdin, each answered by one line on the stdout it
  was started with: `{"value": ...}` or `{"raised": {"mro": [...], "message": ...}}`. Requests name a target
  (a module attribute by `path`, or a `handle` this process gave out) and an `op`: `get` (an attribute),
  `call`, `len`, `iter`, `getitem`, `contains`, `bool`, `str`.
- Values travel as JSON: None, bools, ints, finite floats, strings and lists as themselves; tuples, sets,
  frozensets, dicts, bytes and other floats tagged (`{"$": kind, "v": ...}`); anything else (an object, a
  function, a class) as a handle, `{"$": "handle", "id", "type"}`, an exception class with its MRO's names.
- REPOSITORY is at the end of `sys.path` (a file named like a standard module does not replace it), and the
  current directory. What the repository's code prints goes nowhere.
- Nothing this process says is trusted: the grader only ever reads answers from it, never a verdict. It is a
  stand-in for the agent's code in the grader's tests, and may be anything the agent wrote.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import os
import sys
from typing import Any

MAX_ITEMS = 100_000  # an iteration answers at most this many items


class Handles:
    def __init__(self) -> None:
        self.objects: dict[int, Any] = {}

    def keep(self, value: Any) -> int:
        number = len(self.objects) + 1
        self.objects[number] = value
        return number


def _qualname(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def encode(value: Any, handles: Handles, depth: int = 0) -> Any:
    if depth > 50:
        raise ValueError("a value nested too deeply to answer")
    if value is None or isinstance(value, bool | str) or type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
    kind = type(value)
    if kind in (list, tuple, set, frozenset):
        items = [encode(item, handles, depth + 1) for item in value]
        return items if kind is list else {"$": kind.__name__, "v": items}
    if kind is dict:
        return {
            "$": "dict",
            "v": [[encode(k, handles, depth + 1), encode(v, handles, depth + 1)] for k, v in value.items()],
        }
    if kind is bytes:
        return {"$": "bytes", "v": base64.b64encode(value).decode()}
    answer: dict[str, Any] = {"$": "handle", "id": handles.keep(value), "type": _qualname(kind)}
    if isinstance(value, type) and issubclass(value, BaseException):
        answer["exception"] = [_qualname(base) for base in value.__mro__]
    return answer


def decode(value: Any, handles: Handles) -> Any:
    if isinstance(value, list):
        return [decode(item, handles) for item in value]
    if not isinstance(value, dict):
        return value
    tag = value.get("$")
    items: Any = value.get("v", [])
    if tag == "handle":
        return handles.objects[value["id"]]
    if tag == "dict":
        return {decode(k, handles): decode(v, handles) for k, v in items}
    if tag == "bytes":
        return base64.b64decode(items)
    if tag == "float":
        return float(items)
    kinds: dict[Any, Any] = {"tuple": tuple, "set": set, "frozenset": frozenset}
    return kinds[tag](decode(item, handles) for item in items)


def target(request: dict[str, Any], handles: Handles) -> Any:
    if "handle" in request:
        return handles.objects[request["handle"]]
    module, *names = request["path"]
    found: Any = importlib.import_module(module)
    for name in names:
        found = getattr(found, name)
    return found


def answer(request: dict[str, Any], handles: Handles) -> Any:
    op, subject = request["op"], target(request, handles)
    args = [decode(a, handles) for a in request.get("args", [])]
    if op == "get":
        return getattr(subject, request["name"])
    if op == "call":
        kwargs = {k: decode(v, handles) for k, v in request.get("kwargs", {}).items()}
        return subject(*args, **kwargs)
    if op == "len":
        return len(subject)
    if op == "iter":
        items = []
        for item in subject:
            items.append(item)
            if len(items) > MAX_ITEMS:
                raise ValueError(f"more than {MAX_ITEMS} items")
        return items
    if op == "getitem":
        return subject[args[0]]
    if op == "contains":
        return args[0] in subject
    if op == "bool":
        return bool(subject)
    if op == "str":
        return str(subject)
    raise ValueError(f"no op {op!r}")


def main() -> None:
    repository = sys.argv[1]
    sys.path.append(repository)
    os.chdir(repository)
    # The protocol keeps the stdout it was started with; what the repository prints is dropped.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    sink = os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115  # for as long as the process lives
    handles = Handles()
    replies.write(json.dumps({"ready": True}) + "\n")  # nothing of the repository has run yet
    for line in sys.stdin:
        try:
            reply: dict[str, Any] = {"value": encode(answer(json.loads(line), handles), handles)}
        except BaseException as error:  # whatever the code raised (SystemExit included) is its answer
            mro = [_qualname(base) for base in type(error).__mro__]
            try:
                message = str(error)
            except BaseException:
                message = ""
            reply = {"raised": {"mro": mro, "message": message[:1000]}}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
