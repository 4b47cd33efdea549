"""The blob store: checkpoints and large artifacts, addressed by URI and verified by content hash.

Contract:
- `put` writes the whole object or nothing (file: a temporary file renamed into place; S3: one PUT) and
  returns a `BlobRef` with the object's URI, SHA-256 and size; the ledger records these, never the bytes.
- `get` returns the bytes and, given the recorded `BlobRef`, checks the hash: a corrupt or replaced
  object raises `BlobIntegrityError` rather than being used.
- Keys are relative paths with `/` separators, and every key stays under its store's root or prefix: a key
  that could escape it (`..`, `.` or empty segments, an absolute path, a backslash, a NUL or other control
  character, a percent-encoded spelling of any of these) raises `BlobKeyError` before anything is read or
  written; on `file://` so does a key that resolves outside the root through a symbolic link.
- Backends: `file://` (the default, under the data directory) and `s3://bucket/prefix` (the `minio` client,
  for MinIO on a cluster or any S3 API).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class BlobRef:
    uri: str
    sha256: str
    size: int


class BlobIntegrityError(RuntimeError):
    """The stored bytes do not match the recorded hash."""


class BlobNotFoundError(FileNotFoundError):
    """No object at that key."""


class BlobKeyError(ValueError):
    """A key (or another path kept with blobs, such as a checkpoint's file name) that is not a plain relative
    path under the store's root or prefix."""

    def __init__(self, key: str, why: str, what: str = "blob key") -> None:
        super().__init__(
            f"{what} {key!r} must be a relative path of plain names separated by '/' (like 'run/step-3/w.bin'): "
            f"it {why}"
        )


class BlobStore(Protocol):
    url: str

    def put(self, key: str, data: bytes) -> BlobRef: ...
    def get(self, key: str, expected: BlobRef | None = None) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def uri(self, key: str) -> str: ...


def _key_problem(key: str) -> str | None:
    """Why `key` could escape its store's root or prefix, or None when it cannot."""
    if not key:
        return "is empty"
    if "\\" in key:
        return "holds a backslash"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        return "holds a NUL or another control character"
    if key.startswith("/"):
        return "is absolute"
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' segment"
    return None


def checked_key(key: str, what: str = "blob key") -> str:
    """`key` when it is a plain relative path that cannot leave the folder it is joined to; else
    `BlobKeyError` naming it as `what`."""
    problem = _key_problem(key)
    if problem is None and "%" in key:
        # A layer below may decode the key again (an S3 gateway, a proxy): its decoded spellings must be plain
        # too.
        decoded = key
        for _ in range(3):
            decoded = unquote(decoded)
            if (found := _key_problem(decoded)) is not None:
                problem = f"{found} once percent-decoded"
                break
    if problem is not None:
        raise BlobKeyError(key, problem, what)
    return key


def _verify(key: str, data: bytes, expected: BlobRef | None) -> bytes:
    if expected is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected.sha256 or len(data) != expected.size:
            raise BlobIntegrityError(
                f"blob {key!r} does not match its record (sha256 {digest[:12]}…, {len(data)} bytes; "
                f"expected {expected.sha256[:12]}…, {expected.size} bytes)"
            )
    return data


class FileBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def _path(self, key: str) -> Path:
        """Where `key` lives, refused when a symbolic link on the way leads out of the root."""
        target = self.root / checked_key(key)
        if not target.resolve().is_relative_to(self.root.resolve()):
            raise BlobKeyError(key, f"resolves outside {self.root} through a symbolic link")
        return target

    def uri(self, key: str) -> str:
        return (self.root / checked_key(key)).as_uri()

    def put(self, key: str, data: bytes) -> BlobRef:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".tmp-", delete=False) as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        Path(tmp.name).replace(target)
        return BlobRef(self.uri(key), hashlib.sha256(data).hexdigest(), len(data))

    def get(self, key: str, expected: BlobRef | None = None) -> bytes:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            raise BlobNotFoundError(f"no blob {key!r} under {self.url}") from None
        return _verify(key, data, expected)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()


class S3BlobStore:
    def __init__(
        self,
        bucket: str,
        prefix: str,
        endpoint: str,
        *,
        secure: bool = True,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        from minio import Minio

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = Minio(
            endpoint,
            access_key=access_key or os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_key=secret_key or os.environ.get("AWS_SECRET_ACCESS_KEY"),
            secure=secure,
        )
        if not self.client.bucket_exists(bucket):
            self.client.make_bucket(bucket)

    def _object(self, key: str) -> str:
        key = checked_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object(key)}"

    def put(self, key: str, data: bytes) -> BlobRef:
        digest = hashlib.sha256(data).hexdigest()
        self.client.put_object(
            self.bucket, self._object(key), io.BytesIO(data), len(data), metadata={"sha256": digest}
        )
        return BlobRef(self.uri(key), digest, len(data))

    def get(self, key: str, expected: BlobRef | None = None) -> bytes:
        from minio.error import S3Error

        try:
            response = self.client.get_object(self.bucket, self._object(key))
        except S3Error as error:
            if error.code == "NoSuchKey":
                raise BlobNotFoundError(f"no blob {key!r} under {self.url}") from None
            raise
        try:
            data = response.read()
        finally:
            response.close()
            response.release_conn()
        return _verify(key, data, expected)

    def exists(self, key: str) -> bool:
        from minio.error import S3Error

        try:
            self.client.stat_object(self.bucket, self._object(key))
        except S3Error as error:
            if error.code in ("NoSuchKey", "NotFound"):
                return False
            raise
        return True


def open_store(url: str, *, s3_endpoint: str | None = None, s3_secure: bool = True) -> BlobStore:
    """The blob store for a `file://` or `s3://` URL."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        root = Path(unquote(parts.path))
        root.mkdir(parents=True, exist_ok=True)
        return FileBlobStore(root)
    if parts.scheme == "s3":
        if not s3_endpoint:
            raise ValueError(f"{url} needs an S3 endpoint: set services.blobs.s3_endpoint=HOST:PORT")
        return S3BlobStore(parts.netloc, parts.path, s3_endpoint, secure=s3_secure)
    raise ValueError(f"blob store URL {url!r} must start with file:// or s3://")
