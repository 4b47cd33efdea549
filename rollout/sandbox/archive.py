"""A folder as one gzip'd tar, bounded both ways: how a command seat's workspace travels between a runner and
the command host that runs it.

Contract:
- `pack(folder, limit_bytes=)` is the folder's files, folders and symbolic links (as links, never followed),
  paths relative to it, as gzip'd tar bytes; `ArchiveTooLarge` when they pack to more than `limit_bytes`.
  Anything else (a socket, a FIFO, a device) and what cannot be read is left out.
- `unpack(data, folder, limit_bytes=, max_entries=)` writes them under `folder` through Python's `data`
  filter, and answers the names it left out: a hard link, a symbolic link whose target is absolute or holds
  `..`, and an entry the filter refuses (a `..` leading out, a device or FIFO) are skipped,
  never written; an absolute name is written under `folder`; set-uid bits are dropped. Before anything is
  written, the whole archive is read: more than `max_entries` entries, or more than `limit_bytes` of file
  contents in all, raise `ArchiveTooLarge`, an archive that cannot be read `UnsafeArchive`, and then nothing
  of it is written. Both are `ValueError`s: the archive is the sender's doing (a policy's workspace, coming
  back), never the receiver's.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Buffer
from pathlib import Path

MAX_ARCHIVE_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 100_000


class ArchiveTooLarge(ValueError):
    pass


class UnsafeArchive(ValueError):
    pass


class _Bounded(io.RawIOBase):
    """A sink that refuses to grow past its limit."""

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()
        self.limit = limit

    def writable(self) -> bool:
        return True

    def write(self, data: Buffer, /) -> int:
        size = memoryview(data).nbytes
        if len(self.buffer) + size > self.limit:
            raise ArchiveTooLarge(f"the folder packs to more than {self.limit} bytes")
        self.buffer += data
        return size


def pack(folder: Path, *, limit_bytes: int = MAX_ARCHIVE_BYTES) -> bytes:
    sink = _Bounded(limit_bytes)
    with tarfile.open(fileobj=sink, mode="w:gz") as archive:
        for root, dirs, files in os.walk(folder, followlinks=False):
            dirs.sort()
            for name in [*sorted(dirs), *sorted(files)]:
                path = Path(root, name)
                if not (path.is_symlink() or path.is_dir() or path.is_file()):
                    continue  # a socket, a FIFO, a device: nothing a workspace's reader needs
                try:
                    archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
                except PermissionError:
                    continue  # the command made it unreadable: it does not come back
    return bytes(sink.buffer)


def unpack(
    data: bytes, folder: Path, *, limit_bytes: int = MAX_ARCHIVE_BYTES, max_entries: int = MAX_ENTRIES
) -> list[str]:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members: list[tarfile.TarInfo] = []
            total = 0
            for member in archive:
                members.append(member)
                total += member.size if member.isfile() else 0
                if len(members) > max_entries:
                    raise ArchiveTooLarge(f"the archive holds more than {max_entries} entries")
                if total > limit_bytes:
                    raise ArchiveTooLarge(f"the archive's files hold more than {limit_bytes} bytes")
            destination, kept, left_out = str(folder), list[tarfile.TarInfo](), list[str]()
            for member in members:
                # Hard links, and links whose target is absolute or climbs, are never written, whatever this
                # Python's `data` filter passes (before 3.13.4 some link targets went unchecked).
                target = member.linkname
                if member.islnk() or (
                    member.issym() and (target.startswith("/") or ".." in target.split("/"))
                ):
                    left_out.append(member.name)
                    continue
                try:
                    kept.append(tarfile.data_filter(member, destination))
                except tarfile.FilterError:
                    left_out.append(member.name)
            # Filtered again as each is written: a link written earlier cannot lead a later entry out.
            archive.extractall(folder, members=kept, filter="data")
            return left_out
    except tarfile.FilterError as error:
        raise UnsafeArchive(f"the archive is refused: {error}") from error
    except (tarfile.TarError, EOFError, OSError, UnicodeError) as error:
        raise UnsafeArchive(f"the archive cannot be read: {error}") from error
