"""Reading back what W&B wrote on this machine: the `.wandb` transaction log of every local run directory.

Contract:
- `history(root, run_id)` returns the history rows of every run directory under `root/wandb` whose id is
  `run_id` (online and offline runs alike: wandb writes the log in both modes; each resume or restart adds a
  directory), oldest directory first, each row a dict of its logged keys to their decoded values with its
  `_step`. A truncated last record (the writer was killed mid-write) ends that file's rows; nothing else is
  skipped.
- The file is wandb's own format: a 7-byte header (`:W&B`, magic 0xBEE1, version 0), then the records in
  LevelDB's log framing (32 KiB blocks; each chunk a 7-byte header of masked CRC-32C, length and type: full,
  first, middle, last); each record a `wandb.proto.wandb_internal_pb2.Record`. wandb 0.31 reads it only in
  its Go core, so the framing is read here and every record is parsed by wandb's own message class. Checksums
  are not verified: the reader trusts its own machine's files as wandb's sync does not.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def run_files(root: Path, run_id: str) -> list[Path]:
    """Every `.wandb` log of run `run_id` under `root/wandb`, oldest directory first (their names start with
    the time they were made)."""
    directories = sorted((root / "wandb").glob(f"*-{run_id}"))
    return [log for directory in directories for log in sorted(directory.glob(f"run-{run_id}.wandb"))]


def records(path: Path) -> Iterator[bytes]:
    """The raw records of one log, in order."""
    data = path.read_bytes()
    if not data.startswith(_HEADER):
        raise ValueError(f"{path} is not a W&B transaction log (no :W&B header)")
    offset = len(_HEADER)
    pending = b""
    while offset + _CHUNK_HEADER <= len(data):
        left_in_block = _BLOCK - offset % _BLOCK
        if left_in_block < _CHUNK_HEADER:  # a block's tail too short for a header is padding
            offset += left_in_block
            continue
        _checksum, length, kind = struct.unpack_from("<IHB", data, offset)
        start = offset + _CHUNK_HEADER
        if kind == 0 and length == 0:  # zero padding up to the block's end
            offset += left_in_block
            continue
        if start + length > len(data):
            return  # the writer stopped mid-record
        chunk = data[start : start + length]
        offset = start + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""
        else:
            raise ValueError(f"{path}: unknown chunk type {kind} at byte {offset}")


def history(root: Path, run_id: str) -> list[dict[str, Any]]:
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    rows: list[dict[str, Any]] = []
    for path in run_files(root, run_id):
        for raw in records(path):
            record = wandb_internal_pb2.Record()  # pyright: ignore[reportAttributeAccessIssue]
            try:
                record.ParseFromString(raw)
            except DecodeError:  # a file cut short mid-record: what came before it is the whole history
                break
            if record.WhichOneof("record_type") != "history":
                continue
            row: dict[str, Any] = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            row.setdefault("_step", record.history.step.num)
            rows.append(row)
    return rows
