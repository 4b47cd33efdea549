"""How the suite spreads over pytest-xdist's workers (a pytest plugin, loaded by the root conftest).

The suite runs in parallel processes (`-n auto`: one per core, at most `MAX_WORKERS`; `-n 0` runs it in one)
because a third of a serial run is spent waiting (services starting, heartbeats timing out, retries backing
off) with both cores idle. The contract:

- A test module runs whole in one worker, in its order, so its module-scoped stack and fixtures are built
  once. Each worker has its own session stack; what workers share on disk (the built-in models, the minecraft
  kind's packages, the agent CLIs) is installed under a file lock.
- The modules of one of `GROUPS` run one after another in one worker: what they share is built once, or must
  not change under one of them while it runs.
- Modules that start whole stacks (the `slow` marker) are handed out first, so that no long module is left to
  run alone at the end.
- Each worker and every process it starts picks ports from its own slice (`rollout.net.PORT_SLICE_VARIABLE`),
  so two stacks never pick the same port.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler import LoadScopeScheduling

MAX_WORKERS = 4

GROUPS: dict[str, tuple[str, ...]] = {
    # `trained_run` is a whole training run, and Sybil gives every docs example all its fixtures.
    "trained-run": (
        "README.md",
        "docs/",
        "tests/test_monitor.py",
        "tests/test_checkpoint_export.py",
        "tests/test_monitor_browser.py",
        "tests/test_tracking.py",
    ),
    # One npm folder holds both agent CLIs: installing the second rewrites it while the first may be running.
    "agent-clis": ("tests/test_agent_clis.py", "tests/test_coding_agents.py"),
}
"""Each group's modules, by path from the repository root (a path ending in / names a folder's files)."""


def group_of(module: str) -> str:
    """The scheduling unit a module (its path from the repository root) belongs to: its group or itself."""
    for group, members in GROUPS.items():
        if any(
            module == member or (member.endswith("/") and module.startswith(member)) for member in members
        ):
            return group
    return module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling:
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        """xdist's scope scheduling (whole units, in collection order), with `group_of` as the unit."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid.split("::", 1)[0])

    return ByGroup(config, log)


def pytest_configure(config: pytest.Config) -> None:
    from rollout.net import PORT_SLICE_VARIABLE

    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and count:
        os.environ[PORT_SLICE_VARIABLE] = f"{worker.removeprefix('gw')}/{count}"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow groups first, each module's tests in their order. Every worker sorts alike (xdist requires the
    same collection everywhere) and the scheduler hands units out in this order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow = {group_of(_module(item)) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: group_of(_module(item)) not in slow)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]
