"""Two writers of one blob take turns (``BlobStore.fill`` locks the partial): a stick's copy
and a fetch of the same bundle never write one partial at once, so a lying source cannot
truncate the file under an honest writer that then stores it as verified."""

from __future__ import annotations

import hashlib
import io
import threading
from pathlib import Path

import pytest

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.errors import StoreSourceMismatch

CHUNK = 64 << 10
DATA = bytes(range(256)) * (8 * CHUNK // 256)
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()


class Gate(io.RawIOBase):
    """``data`` from ``offset``, one chunk at a time; after the first chunk it waits for
    ``go`` (so the other writer is started while this one holds the partial)."""

    def __init__(self, data: bytes, offset: int, started: threading.Event, go: threading.Event):
        self.data, self.at, self.started, self.go = data, offset, started, go

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.at > 0:
            self.started.set()
            assert self.go.wait(10)
        chunk = self.data[self.at : self.at + min(len(buffer), CHUNK)]
        buffer[: len(chunk)] = chunk
        self.at += len(chunk)
        return len(chunk)


def test_an_honest_and_a_lying_writer_of_one_blob_take_turns(tmp_path: Path) -> None:
    root = tmp_path / "store"
    BlobStore(root).ensure()
    started, go, second_opened = threading.Event(), threading.Event(), threading.Event()
    lie = bytes(len(DATA))  # right size, wrong bytes

    def honest() -> None:
        store = BlobStore(root, chunk_bytes=CHUNK)
        try:
            store.commit(store.fill(DIGEST, len(DATA), lambda o: Gate(DATA, o, started, go)))
        finally:
            store.close()

    errors: list[BaseException] = []

    def liar() -> None:
        store = BlobStore(root, chunk_bytes=CHUNK)
        second_opened.set()
        try:
            store.fill(DIGEST, len(DATA), lambda o: io.BytesIO(lie[o:]))
        except StoreSourceMismatch as err:
            errors.append(err)
        finally:
            store.close()

    first = threading.Thread(target=honest)
    first.start()
    assert started.wait(10)  # the honest writer holds the partial, one chunk written
    second = threading.Thread(target=liar)
    second.start()
    assert second_opened.wait(10)
    second.join(0.5)
    assert second.is_alive()  # waiting for its turn, not writing
    go.set()
    first.join(10)
    second.join(10)
    stored = BlobStore(root).path(DIGEST)
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == DIGEST.removeprefix("sha256:")
    assert len(errors) == 1  # the liar's bytes were refused after its turn came
    assert BlobStore(root).partials() == {}


@pytest.mark.parametrize("count", [2, 3])
def test_honest_writers_of_one_blob_one_after_the_other_store_it_once(
    tmp_path: Path, count: int
) -> None:
    root = tmp_path / "store"
    BlobStore(root).ensure()

    def write() -> None:
        store = BlobStore(root, chunk_bytes=CHUNK)
        try:
            store.commit(store.fill(DIGEST, len(DATA), lambda o: io.BytesIO(DATA[o:])))
        finally:
            store.close()

    threads = [threading.Thread(target=write) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert BlobStore(root).stored() == {DIGEST: len(DATA)}
    assert BlobStore(root).partials() == {}
