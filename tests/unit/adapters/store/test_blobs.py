"""Blob writes on a real tmp filesystem: verified, size-bounded, resumable, read verified."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.source import open_blob
from nodeagent.errors import StoreBlobCorrupt, StoreBlobMissing, StoreSourceMismatch

DATA = os.urandom(3 * 64 * 1024 + 123)
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()
CHUNK = 64 * 1024


class Source:
    """``DATA`` from an offset, counting the bytes handed out; optionally failing at a byte."""

    def __init__(self, data: bytes = DATA, *, fail_after: int | None = None) -> None:
        self.data, self.fail_after = data, fail_after
        self.read_bytes = 0
        self.offsets: list[int] = []

    def open(self, offset: int) -> Source:
        self.offsets.append(offset)
        self.stream = io.BytesIO(self.data)
        self.stream.seek(offset)
        return self

    def readinto(self, buffer: memoryview) -> int:
        if self.fail_after is not None and self.read_bytes >= self.fail_after:
            raise OSError(5, "Input/output error")
        count = self.stream.readinto(buffer)
        self.read_bytes += count
        return count


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    blobs = BlobStore(tmp_path / "store", chunk_bytes=CHUNK)
    blobs.ensure()
    return blobs


def _store(store: BlobStore, source: Source) -> None:
    store.commit(store.fill(DIGEST, len(DATA), source.open))


def test_a_blob_is_stored_only_when_complete_and_matching(store: BlobStore) -> None:
    source = Source()
    filled = store.fill(DIGEST, len(DATA), source.open)
    assert store.size_of(DIGEST) is None  # written, not stored: not in blobs/ yet
    store.commit(filled)
    assert store.path(DIGEST).read_bytes() == DATA
    assert store.stored() == {DIGEST: len(DATA)}
    assert source.read_bytes == len(DATA)
    assert list(store.tmp_dir.iterdir()) == []


def test_a_longer_source_is_stopped_at_the_first_byte_too_many(store: BlobStore) -> None:
    source = Source(DATA + b"x" * (5 * CHUNK))
    with pytest.raises(StoreSourceMismatch, match="longer than") as caught:
        store.fill(DIGEST, len(DATA), source.open)
    assert caught.value.is_size
    assert source.read_bytes <= len(DATA) + CHUNK  # stopped in the chunk that passed the size
    assert store.stored() == {}
    assert list(store.tmp_dir.iterdir()) == []


def test_a_shorter_or_other_source_stores_nothing(store: BlobStore) -> None:
    with pytest.raises(StoreSourceMismatch, match="ended after"):
        store.fill(DIGEST, len(DATA), Source(DATA[:-1]).open)
    other = bytearray(DATA)
    other[100] ^= 1
    with pytest.raises(StoreSourceMismatch, match="another digest") as caught:
        store.fill(DIGEST, len(DATA), Source(bytes(other)).open)
    assert not caught.value.is_size
    assert store.stored() == {}
    assert list(store.tmp_dir.iterdir()) == []


def test_an_interrupted_write_resumes_where_it_stopped(store: BlobStore) -> None:
    broken = Source(fail_after=2 * CHUNK)
    with pytest.raises(OSError, match="Input/output"):
        store.fill(DIGEST, len(DATA), broken.open)
    assert store.partials()[DIGEST][0] == 2 * CHUNK  # the prefix stays in tmp/
    again = Source()
    filled = store.fill(DIGEST, len(DATA), again.open)
    store.commit(filled)
    assert again.offsets == [2 * CHUNK]
    assert again.read_bytes == len(DATA) - 2 * CHUNK  # the prefix is not read twice
    assert (filled.resumed_at, filled.read_bytes) == (2 * CHUNK, len(DATA) - 2 * CHUNK)
    assert store.path(DIGEST).read_bytes() == DATA


def test_a_damaged_partial_is_copied_again_from_byte_zero(store: BlobStore) -> None:
    partial = store.root / "tmp" / (DIGEST.removeprefix("sha256:") + ".partial")
    partial.write_bytes(b"\0" * CHUNK)  # a tail that never reached the disk before a crash
    source = Source()
    store.commit(store.fill(DIGEST, len(DATA), source.open))
    assert source.offsets == [CHUNK, 0]
    assert store.path(DIGEST).read_bytes() == DATA


def test_reading_a_blob_verifies_it(store: BlobStore) -> None:
    _store(store, Source())
    with open_blob(store.root, DIGEST) as blob:
        assert blob.readinto(memoryview(bytearray(len(DATA) + 1))) == len(DATA)
        assert blob.readinto(memoryview(bytearray(10))) == 0
    path = store.path(DIGEST)
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(StoreBlobCorrupt, match="no longer matches"):
        store.check(DIGEST)
    with pytest.raises(StoreBlobMissing):
        open_blob(store.root, "sha256:" + "0" * 64)


def test_only_digest_names_count_as_blobs(store: BlobStore) -> None:
    (store.blob_dir / "notes.txt").write_text("x")
    (store.blob_dir / ("a" * 64)).mkdir()
    assert store.stored() == {}
