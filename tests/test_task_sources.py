"""Datasets as task sources (rollout.task_sources): local parquet and JSON Lines read through `datasets`, in a
seeded order that a restarted runner plays again from any group, streamed or not; bad columns refused in one
line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.environment import Dataset, HFDatasetError, TaskSource

ROWS = 20


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "tasks.parquet"
    table = pa.table(
        {
            "question": [f"q{i}" for i in range(ROWS)],
            "answer": list(range(ROWS)),
            "meta": [{"level": i % 3, "tags": ["x"] * (i % 2)} for i in range(ROWS)],
        }
    )
    pq.write_table(table, path, row_group_size=4)  # several row groups, as a real file has
    return path


def _questions(source: TaskSource, groups: range | list[int]) -> list[str]:
    return [source.parameters(g)["question"] for g in groups]


def test_a_seeded_dataset_shuffles_each_epoch_and_a_restarted_runner_plays_the_same_rows(
    parquet: Path,
) -> None:
    plain = Dataset.from_files(parquet)
    assert _questions(plain, range(ROWS + 2)) == [f"q{i}" for i in range(ROWS)] + ["q0", "q1"]

    seeded = Dataset.from_files(parquet, seed=7)
    first, second = _questions(seeded, range(ROWS)), _questions(seeded, range(ROWS, 2 * ROWS))
    assert sorted(first) == sorted(second) == sorted(f"q{i}" for i in range(ROWS))  # each row once an epoch
    assert first != [f"q{i}" for i in range(ROWS)] and second != first  # shuffled, and anew each epoch

    # A runner restarted mid-run (a new process builds the source anew) plays what the first would have,
    # from whatever group it resumes at, in whatever order groups come.
    restarted = Dataset.from_files(parquet, seed=7)
    assert _questions(restarted, [33, 5, 21, 0]) == [second[13], first[5], second[1], first[0]]
    assert _questions(Dataset.from_files(parquet, seed=8), range(ROWS)) != first  # the seed decides


def test_a_streamed_dataset_resumes_at_any_group_and_reads_back_when_asked(parquet: Path) -> None:
    streamed = Dataset.from_files(parquet, streaming=True, seed=3)
    played = _questions(streamed, range(2 * ROWS + 3))
    assert sorted(played[:ROWS]) == sorted(f"q{i}" for i in range(ROWS))
    assert played[ROWS:] != played[: ROWS + 3] and sorted(played[ROWS : 2 * ROWS]) == sorted(played[:ROWS])

    resumed = Dataset.from_files(parquet, streaming=True, seed=3)
    assert _questions(resumed, [ROWS + 4, 2, 2 * ROWS + 1, 0]) == [
        played[ROWS + 4],
        played[2],
        played[-2],
        played[0],
    ]
    assert _questions(Dataset.from_files(parquet, streaming=True), range(3)) == ["q0", "q1", "q2"]


def test_columns_pick_and_rename_and_values_that_are_not_strings_travel_as_json(parquet: Path) -> None:
    renamed = Dataset.from_files(parquet, columns={"question": "prompt", "answer": "solution"}).parameters(4)
    assert renamed == {"prompt": "q4", "solution": "4"}
    kept = Dataset.from_files(parquet, columns=["meta"]).parameters(3)
    assert json.loads(kept["meta"]) == {"level": 0, "tags": ["x"]}
    whole = Dataset.from_files(parquet).parameters(1)
    assert set(whole) == {"question", "answer", "meta"} and all(isinstance(v, str) for v in whole.values())


def test_json_lines_files_read_as_tasks_in_the_order_given(tmp_path: Path) -> None:
    files = []
    for part in range(2):
        path = tmp_path / f"part{part}.jsonl"
        path.write_text("".join(json.dumps({"task": f"{part}-{i}"}) + "\n" for i in range(3)))
        files.append(path)
    source = Dataset.from_files(files)
    assert [source.parameters(g)["task"] for g in range(7)] == [
        "0-0",
        "0-1",
        "0-2",
        "1-0",
        "1-1",
        "1-2",
        "0-0",
    ]


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (
            lambda p: Dataset.from_files(p, columns={"questoin": "prompt"}).parameters(0),
            "no column 'questoin'",
        ),
        (lambda p: Dataset.from_files(p, columns=["answer", "nope"], streaming=True).parameters(0), "'nope'"),
        (lambda p: Dataset.from_files([p, p.with_suffix(".csv")]), "one format"),
        (lambda p: Dataset.from_files(p.with_name("absent.parquet")), "no such file"),
        (lambda p: Dataset.from_files(p, columns="question"), "not the string"),
    ],
)
def test_a_dataset_that_cannot_be_read_as_tasks_says_why_in_one_line(parquet: Path, make, says: str) -> None:
    with pytest.raises(HFDatasetError) as refused:
        make(parquet)
    message = str(refused.value)
    assert says in message and "\n" not in message
    if "column" in says:
        assert "its columns are question, answer, meta" in message


def test_a_hub_dataset_is_named_as_the_hub_names_it_and_read_only_when_played() -> None:
    source = Dataset.from_hf("openai/gsm8k", "test", name="main", columns={"question": "question"}, seed=1)
    assert source.what == "openai/gsm8k (main), split test"  # nothing was read: this machine is offline
    # Importing an environment imports no dataset library: workflow code imports rollout.environment.
    code = "import sys, rollout.environment; print('datasets' in sys.modules, 'pyarrow' in sys.modules)"
    assert subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split() == [
        "False",
        "False",
    ]
