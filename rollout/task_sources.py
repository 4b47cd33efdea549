"""Task sources: where a run's tasks come from, one parameter set per group index.

Contract:
- Every source is deterministic by index: `parameters(group)` is the same on every machine, every retry and
  after any restart, because it depends on the group index alone; so workflows pass only the index and each
  runner rebuilds the task itself.
- A `Dataset` cycles through its rows; a `Generator` draws from a RNG seeded by (seed, group).
- An `HFDataset` (`Dataset.from_hf` for a dataset on the Hugging Face Hub, `Dataset.from_files` for parquet,
  JSON Lines or CSV files) reads its rows through the `datasets` library, imported only when rows are first
  read (without it the error says how to install it); nothing is read before the first call, so importing an
  environment stays cheap, and the dataset is loaded once per process.
  - Order: without a `seed`, the dataset's own, cycled. With one, each pass over the rows (an epoch: `group //
    rows`) is a permutation drawn from (`seed`, epoch), each epoch shuffled anew. A streamed dataset
    (`streaming=True`, for sets too large to download first) is read in its own order, shuffled by
    a buffer of `SHUFFLE_BUFFER` rows under (`seed`, epoch) when a seed is given, forward from a cursor: a
    group index below the newest `RECENT_ROWS` read re-opens the stream and reads up to it again.
  - `columns` picks what a task gets: a list of column names (each under its own name) or a mapping from a
    column's name to the task parameter's; without it every column is kept. A column the dataset lacks is
    refused with one line naming it and the columns the dataset has (`HFDatasetError`, a `ValueError`), as
    is a dataset that cannot be read or has no rows.
  - Task parameters are strings: a string value stays as it is; any other (a number, a list, a nested
    record, None) is written as JSON.
- This module imports only the standard library at run time (workflow code imports rollout.environment).
"""

from __future__ import annotations

import abc
import json
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets

TaskParameters = dict[str, str]


class TaskSource(abc.ABC):
    """Where the tasks of a run come from: one parameter set per group index."""

    @abc.abstractmethod
    def parameters(self, group: int) -> TaskParameters: ...


@dataclass(frozen=True)
class Dataset(TaskSource):
    """A fixed list of tasks, cycled through in order."""

    rows: Sequence[TaskParameters]

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("a Dataset needs at least one row")

    def parameters(self, group: int) -> TaskParameters:
        return dict(self.rows[group % len(self.rows)])

    @staticmethod
    def from_hf(
        path: str,
        split: str = "train",
        *,
        name: str | None = None,
        revision: str | None = None,
        columns: Sequence[str] | Mapping[str, str] | None = None,
        seed: int | None = None,
        streaming: bool = False,
    ) -> HFDataset:
        """A dataset on the Hugging Face Hub (an id such as `openai/gsm8k`, with its configuration as `name`),
        or a local folder `datasets` reads, as tasks: an `HFDataset`."""
        return HFDataset(
            path,
            split,
            name=name,
            revision=revision,
            columns=_column_names(columns),
            seed=seed,
            streaming=streaming,
        )

    @staticmethod
    def from_files(
        files: str | Path | Sequence[str | Path],
        *,
        columns: Sequence[str] | Mapping[str, str] | None = None,
        seed: int | None = None,
        streaming: bool = False,
    ) -> HFDataset:
        """Parquet, JSON Lines (`.jsonl`, `.json`) or CSV files as tasks, read in the order given: an
        `HFDataset`. The files are all of one format, told by their suffix."""
        paths = [Path(files)] if isinstance(files, str | Path) else [Path(f) for f in files]
        if not paths:
            raise HFDatasetError("from_files needs at least one file")
        formats = {FILE_FORMATS.get(p.suffix.lower()) for p in paths}
        if None in formats or len(formats) != 1:
            raise HFDatasetError(
                f"from_files reads files of one format, told by their suffix ({', '.join(FILE_FORMATS)}), not "
                f"{', '.join(p.name for p in paths)}"
            )
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise HFDatasetError(f"no such file: {', '.join(missing)}")
        return HFDataset(
            formats.pop() or "",
            data_files=tuple(str(p.resolve()) for p in paths),
            columns=_column_names(columns),
            seed=seed,
            streaming=streaming,
        )


@dataclass(frozen=True)
class Generator(TaskSource):
    """Tasks drawn by `make` from a RNG seeded by (seed, group): endless, and the same everywhere."""

    make: Callable[[random.Random], TaskParameters]
    seed: int = 0

    def parameters(self, group: int) -> TaskParameters:
        return dict(self.make(random.Random(f"{self.seed}/{group}")))


FILE_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
RECENT_ROWS = 256  # rows a streamed dataset keeps behind its cursor, for groups played out of order
# Rows a seeded stream shuffles among: ours, not `datasets`' (whose shuffled stream sleeps 5 s each time one
# is closed early, and whose order may change with its version).
SHUFFLE_BUFFER = 1000


class HFDatasetError(ValueError):
    """A dataset that cannot be read as tasks: the one-line reason."""


@dataclass(frozen=True)
class HFDataset(TaskSource):
    """Tasks from a dataset `datasets.load_dataset(path, name, split=split, ...)` reads (a Hub id, or a
    builder such as `parquet` with `data_files`)."""

    path: str
    split: str = "train"
    name: str | None = None  # the dataset's configuration (subset)
    data_files: tuple[str, ...] = ()
    revision: str | None = None
    columns: Mapping[str, str] | None = None  # the dataset's column -> the task parameter's name
    seed: int | None = None
    streaming: bool = False
    _state: _Loaded = field(default_factory=lambda: _Loaded(), init=False, repr=False, compare=False)

    @property
    def what(self) -> str:
        """The dataset as a person names it, for messages."""
        if self.data_files:
            return ", ".join(self.data_files)
        return f"{self.path}{f' ({self.name})' if self.name else ''}, split {self.split}"

    def parameters(self, group: int) -> TaskParameters:
        if group < 0:
            raise ValueError(f"a group index is 0 or more, not {group}")
        with self._state.lock:
            if self.streaming:
                return self._streamed(group)
            table = self._table()
            epoch, position = divmod(group, len(table))
            index = position if self.seed is None else self._permutation(epoch, len(table))[position]
            return self._task(table[index])

    def _table(self) -> datasets.Dataset:
        if self._state.table is None:
            loaded = self._load()
            if len(loaded) == 0:
                raise HFDatasetError(f"dataset {self.what} has no rows")
            self._state.table = loaded
        return self._state.table

    def _permutation(self, epoch: int, rows: int) -> list[int]:
        if self._state.permutation[0] != epoch:
            order = list(range(rows))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._state.permutation = (epoch, order)
        return self._state.permutation[1]

    def _streamed(self, group: int) -> TaskParameters:
        state = self._state
        rows = state.stream_rows
        if (
            rows is not None
        ):  # the stream's length is known: a group past it is an earlier row of a later epoch
            epoch, position = divmod(group, rows)
        else:
            epoch, position = 0, group
        if position in state.recent and state.recent_epoch == epoch:
            return self._task(state.recent[position])
        if state.cursor is None or state.cursor_epoch != epoch or position < state.next_position:
            state.cursor, state.cursor_epoch, state.next_position = self._stream(epoch), epoch, 0
            state.recent.clear()
            state.recent_epoch = epoch
        while state.next_position <= position:
            row = next(state.cursor, None)
            if row is None:  # the end of the stream: now its length is known
                if state.next_position == 0:
                    raise HFDatasetError(f"dataset {self.what} has no rows")
                state.stream_rows, state.cursor = state.next_position, None
                return self._streamed(group)
            state.recent[state.next_position] = row
            if len(state.recent) > RECENT_ROWS:
                state.recent.popitem(last=False)
            state.next_position += 1
        return self._task(state.recent[position])

    def _stream(self, epoch: int) -> Iterator[dict[str, Any]]:
        if self._state.table is None:
            self._state.table = self._load()
        rows: Iterator[dict[str, Any]] = iter(self._state.table)
        if self.seed is None:
            return rows
        return _buffer_shuffled(rows, random.Random(f"{self.seed}/{epoch}"), SHUFFLE_BUFFER)

    def _load(self) -> Any:
        try:
            import datasets
        except ImportError as error:
            raise HFDatasetError(
                "reading a dataset needs the `datasets` library: `uv add datasets` (or install rollout[datasets])"
            ) from error
        try:
            loaded = datasets.load_dataset(
                self.path,
                self.name,
                split=self.split,
                data_files=list(self.data_files) or None,
                revision=self.revision,
                streaming=self.streaming,
            )
        except (OSError, ValueError) as error:  # a dataset the Hub lacks is a FileNotFoundError too
            reason = " ".join(str(error).split()) or type(error).__name__
            raise HFDatasetError(f"dataset {self.what} cannot be read: {reason}") from error
        self._check_columns(list(loaded.column_names or ()))
        return loaded

    def _check_columns(self, present: list[str]) -> None:
        missing = [column for column in self.columns or {} if column not in present]
        if missing:
            raise HFDatasetError(
                f"dataset {self.what} has no column {', '.join(map(repr, missing))}; its columns are "
                f"{', '.join(present)}"
            )

    def _task(self, row: Mapping[str, Any]) -> TaskParameters:
        picked = row.items() if self.columns is None else ((c, row[c]) for c in self.columns)
        names = self.columns or {}
        return {names.get(column, column): _as_parameter(value) for column, value in picked}


@dataclass
class _Loaded:
    """What one process has read of a dataset (not part of the source's value)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    table: Any = None
    permutation: tuple[int, list[int]] = (-1, [])
    cursor: Iterator[dict[str, Any]] | None = None
    cursor_epoch: int = 0
    next_position: int = 0
    stream_rows: int | None = None
    recent: OrderedDict[int, dict[str, Any]] = field(default_factory=OrderedDict[int, dict[str, Any]])
    recent_epoch: int = 0


def _buffer_shuffled(
    rows: Iterator[dict[str, Any]], rng: random.Random, size: int
) -> Iterator[dict[str, Any]]:
    """`rows` in a shuffled order, holding at most `size` of them: each row read replaces a random one of
    the buffer, which is passed on; the buffer's rest, shuffled, ends the stream."""
    buffer: list[dict[str, Any]] = []
    for row in rows:
        if len(buffer) < size:
            buffer.append(row)
            continue
        slot = rng.randrange(size)
        yield buffer[slot]
        buffer[slot] = row
    rng.shuffle(buffer)
    yield from buffer


def _as_parameter(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _column_names(columns: Sequence[str] | Mapping[str, str] | None) -> Mapping[str, str] | None:
    """`columns` as the mapping `HFDataset` keeps: a list keeps each column under its own name."""
    if columns is None:
        return None
    if isinstance(columns, Mapping):
        return dict(columns)
    if isinstance(columns, str):
        raise HFDatasetError(f"columns is a list of names or a mapping, not the string {columns!r}")
    return {column: column for column in columns}
