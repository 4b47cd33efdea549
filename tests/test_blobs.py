"""Blob stores: file:// on disk and s3:// against moto's standalone S3 server."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from rollout.blobs import BlobIntegrityError, BlobNotFoundError, BlobStore, FileBlobStore, open_store
from rollout.net import free_port


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop()


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BlobStore:
    if request.param == "file":
        return open_store((tmp_path / "blobs").as_uri())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    endpoint = request.getfixturevalue("s3_endpoint")
    return open_store(f"s3://checkpoints/{tmp_path.name}", s3_endpoint=endpoint, s3_secure=False)


def test_put_records_the_content_hash_and_get_verifies_it(store: BlobStore) -> None:
    ref = store.put("run-1/ckpt-3/adapter.safetensors", b"weights" * 100)
    assert ref.size == 700
    assert ref.sha256 == "a82087423a13cb9d32812403246e56861ec29245d76c8c90a455255bf91dff17"
    assert ref.uri.endswith("run-1/ckpt-3/adapter.safetensors")
    assert store.get("run-1/ckpt-3/adapter.safetensors", expected=ref) == b"weights" * 100
    assert store.exists("run-1/ckpt-3/adapter.safetensors")
    assert not store.exists("run-1/ckpt-4/adapter.safetensors")


def test_a_replaced_object_fails_its_hash_check(store: BlobStore) -> None:
    ref = store.put("a/b", b"original")
    store.put("a/b", b"tampered")
    with pytest.raises(BlobIntegrityError, match="does not match"):
        store.get("a/b", expected=ref)


def test_missing_objects_and_escaping_keys_are_refused(store: BlobStore) -> None:
    with pytest.raises(BlobNotFoundError):
        store.get("nope")
    for bad in ("../etc/passwd", "/abs", ""):
        with pytest.raises(ValueError, match="relative path"):
            store.put(bad, b"x")


def test_file_store_leaves_no_partial_files(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)
    store.put("x/y.bin", b"1" * 10_000)
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["y.bin"]


def test_unknown_schemes_and_s3_without_endpoint_say_what_to_set() -> None:
    with pytest.raises(ValueError, match=r"file:// or s3://"):
        open_store("ftp://host/x")
    with pytest.raises(ValueError, match=r"services\.blobs\.s3_endpoint"):
        open_store("s3://bucket/x")
