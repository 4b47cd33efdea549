"""Blob stores: file:// on disk and s3:// against moto's standalone S3 server."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from rollout.blobs import (
    BlobIntegrityError,
    BlobKeyError,
    BlobNotFoundError,
    BlobStore,
    FileBlobStore,
    S3BlobStore,
    open_store,
)
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


# Keys that would leave the store's root or prefix, as written and as a layer below might decode them.
ESCAPING_KEYS = [
    "..",
    "../outside",
    "a/../../outside",
    "a/./b",
    "a//b",
    "a/",
    "/etc/passwd",
    "..\\outside",
    "a\\..\\..\\outside",
    "a\x00b",
    "a\nb",
    "%2e%2e/outside",
    "%2E%2E%2Foutside",
    "a/%2e%2e%2f%2e%2e%2foutside",
    "%252e%252e/outside",
    "%2fetc/passwd",
    "a%5c..%5coutside",
    "a%00b",
]


@pytest.mark.parametrize("key", ESCAPING_KEYS)
def test_keys_that_escape_their_prefix_are_refused_before_any_io(
    store: BlobStore, key: str, tmp_path: Path
) -> None:
    for action in (
        lambda: store.put(key, b"x"),
        lambda: store.get(key),
        lambda: store.exists(key),
        lambda: store.uri(key),
    ):
        with pytest.raises(BlobKeyError, match="must be a relative path of plain names"):
            action()
    # Nothing was written anywhere: not beside the file store's root, not outside the S3 prefix.
    if isinstance(store, FileBlobStore):
        assert sorted(p.name for p in tmp_path.iterdir()) == ["blobs"]
        assert list((tmp_path / "blobs").iterdir()) == []
    else:
        assert isinstance(store, S3BlobStore)
        names = [o.object_name or "" for o in store.client.list_objects(store.bucket, recursive=True)]
        assert not [name for name in names if name.startswith(f"{store.prefix}/")]
        # Every other test's objects sit under its own prefix (its tmp_path's name): none escaped one.
        assert all(name.startswith("test_") for name in names), names


def test_plain_keys_with_dots_and_percent_signs_are_kept(store: BlobStore) -> None:
    for key in (".hidden/file", "a/b..c/..d", "step-3/50%/w.bin", "x/config.json"):
        ref = store.put(key, key.encode())
        assert store.get(key, expected=ref) == key.encode()


def test_file_store_refuses_a_symlink_out_of_its_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "blobs", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "file-link").symlink_to(outside / "secret")
    store = FileBlobStore(root)
    for key in ("escape/secret", "escape/new", "file-link"):
        with pytest.raises(BlobKeyError, match="through a symbolic link"):
            store.get(key)
        with pytest.raises(BlobKeyError, match="through a symbolic link"):
            store.put(key, b"overwrite")
        with pytest.raises(BlobKeyError, match="through a symbolic link"):
            store.exists(key)
    assert (outside / "secret").read_bytes() == b"not yours"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    # A link that stays inside the root is followed.
    (root / "inside").mkdir()
    (root / "alias").symlink_to(root / "inside", target_is_directory=True)
    store.put("alias/x", b"ok")
    assert (root / "inside" / "x").read_bytes() == b"ok"


def test_file_store_leaves_no_partial_files(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)
    store.put("x/y.bin", b"1" * 10_000)
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["y.bin"]


def test_unknown_schemes_and_s3_without_endpoint_say_what_to_set() -> None:
    with pytest.raises(ValueError, match=r"file:// or s3://"):
        open_store("ftp://host/x")
    with pytest.raises(ValueError, match=r"services\.blobs\.s3_endpoint"):
        open_store("s3://bucket/x")
