"""The coding tasks shipped in this package: one directory per task under `dataset/`, named `NN-id` (NN orders
the dataset; the last `HELD_OUT` tasks are kept for evals), and its grader's half under
`grader/dataset/NN-id/`.

What the agent may see (`dataset/NN-id/`):
- `task.json`: `kind` (`fix` a failing function, `add-case` to a function missing one, `implement` what a
  class lacks) and `instruction`, what the agent is asked to do;
- `repo/`: the repository the agent starts from (plain Python, with visible tests in `tests.py`).

What only the grader may (`grader/dataset/NN-id/`; never sent to a sandbox, never in a jail):
- `solution/`: the files a reference solution changes, whole (laid over `repo/`);
- `hidden_tests.py`: unittest tests the agent never sees. Each `test_*` method of a `TestCase` class is one
  test, worth an equal share of the reward; their names (`Class.test_name`) are read from the source, so a
  repository that does not even import still has a known number of tests (all failed).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

from rollout.environment import TaskParameters

HELD_OUT = 4  # the last tasks are held out for evals: training never draws them
KINDS = ("fix", "add-case", "implement")


@dataclass(frozen=True)
class CodingTask:
    id: str
    kind: str
    instruction: str
    files: dict[str, str]  # the starting repository: path -> text
    solution: dict[str, str]  # the reference solution's changed files, whole
    hidden_tests: str  # the source of the hidden unittest module

    def solved_files(self) -> dict[str, str]:
        """The repository with the reference solution laid over it."""
        return {**self.files, **self.solution}

    def hidden_test_names(self) -> tuple[str, ...]:
        """`Class.test_name` for every test method of the hidden tests, in source order."""
        names = []
        for node in ast.parse(self.hidden_tests).body:
            if isinstance(node, ast.ClassDef):
                names.extend(
                    f"{node.name}.{item.name}"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and item.name.startswith("test")
                )
        return tuple(names)


def _files_under(folder: Traversable, prefix: str = "") -> dict[str, str]:
    files: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            files |= _files_under(entry, f"{prefix}{entry.name}/")
        else:
            files[f"{prefix}{entry.name}"] = entry.read_text()
    return files


def _task(folder: Traversable, graded: Traversable) -> CodingTask:
    described = json.loads(folder.joinpath("task.json").read_text())
    task = CodingTask(
        id=folder.name.split("-", 1)[1],
        kind=described["kind"],
        instruction=described["instruction"],
        files=_files_under(folder.joinpath("repo")),
        solution=_files_under(graded.joinpath("solution")),
        hidden_tests=graded.joinpath("hidden_tests.py").read_text(),
    )
    if task.kind not in KINDS or not task.hidden_test_names() or not set(task.solution) <= set(task.files):
        raise ValueError(
            f"coding task {folder.name}: a kind of {KINDS}, hidden tests and a solution are needed"
        )
    return task


@cache
def coding_tasks() -> tuple[CodingTask, ...]:
    """Every shipped task, in dataset order."""
    root = resources.files("coding").joinpath("dataset")
    graders = resources.files("coding").joinpath("grader", "dataset")
    folders = sorted((entry for entry in root.iterdir() if entry.is_dir()), key=lambda entry: entry.name)
    return tuple(
        _task(folder, graders.joinpath(folder.name))
        for folder in folders
        if folder.joinpath("task.json").is_file()
    )


def task_named(task_id: str) -> CodingTask:
    for task in coding_tasks():
        if task.id == task_id:
            return task
    raise KeyError(f"no coding task {task_id!r} (tasks: {[task.id for task in coding_tasks()]})")


def rows(tasks: tuple[CodingTask, ...]) -> list[TaskParameters]:
    """Task parameters name the task only: every runner reads the rest from its own copy of the package."""
    return [{"task": task.id, "kind": task.kind} for task in tasks]


def training_tasks() -> tuple[CodingTask, ...]:
    return coding_tasks()[:-HELD_OUT]


def held_out_tasks() -> tuple[CodingTask, ...]:
    return coding_tasks()[-HELD_OUT:]
