"""The suite's groups for parallel workers (tests/scheduling.py) name modules that exist."""

from __future__ import annotations

from pathlib import Path

from tests.scheduling import GROUPS, group_of

ROOT = Path(__file__).resolve().parent.parent


def test_every_grouped_module_exists_and_belongs_to_its_group() -> None:
    for group, members in GROUPS.items():
        for member in members:
            assert (ROOT / member).exists(), (
                f"{member} of group {group} is gone: rename it in tests/scheduling.py"
            )
            if not member.endswith("/"):
                assert group_of(member) == group
    assert group_of("docs/monitor.md") == "trained-run"
    assert group_of("tests/test_net.py") == "tests/test_net.py"
