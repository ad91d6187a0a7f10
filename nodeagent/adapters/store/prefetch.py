"""Reading a medium's blobs ahead, in one thread, while the copy hashes and writes.

Measured (bench/store_copy.py, 0.2 GB, loop devices on one disk): reading, then hashing
and writing each chunk in turn took 1.97x the slower of a raw read and a raw write; the
medium sat idle while a chunk was hashed and written. ``Prefetcher`` reads the blobs in
copy order, each from the offset the copy resumes at, into a bounded queue of chunks
(``QUEUE_CHUNKS`` x the chunk size of memory), and hands them out per blob through
``source(digest)``: the medium is read once, sequentially, without pause. The chunk
buffers are a pool of ``QUEUE_CHUNKS``, reused (a fresh 4 MiB object per chunk costs a
page fault per page). A blob whose copy has to start again from byte 0 (a resumed partial
that did not match) is read again directly, once. Closing stops the thread and drops what
it had read.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from nodeagent.adapters.bundles.tree import BundleDir
from nodeagent.bundles.manifest import ExpectedFile
from nodeagent.errors import HostFileError, NodeAgentError

QUEUE_CHUNKS: Final = 8
_END: Final = memoryview(b"")


@dataclass(frozen=True, slots=True)
class Planned:
    digest: str
    file: ExpectedFile
    offset: int
    """Where the copy of this blob starts (the size of its partial, or 0)."""


class _Stop(Exception):
    pass


class Prefetcher:
    """Reads ``planned`` blobs in order in a thread; ``bytes_read`` counts every byte."""

    def __init__(self, medium: BundleDir, planned: Sequence[Planned], chunk_bytes: int) -> None:
        self.medium = medium
        self.planned = list(planned)
        self.chunk_bytes = chunk_bytes
        self.bytes_read = 0
        self._chunks: queue.Queue[tuple[str, memoryview | BaseException]] = queue.Queue()
        self._free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(QUEUE_CHUNKS):  # reused: a fresh 4 MiB object per chunk costs page faults
            self._free.put(bytearray(chunk_bytes))
        self._stop = threading.Event()
        self._used: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="store-prefetch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()  # it waits for a free buffer at most 0.1 s at a time

    def _put(self, digest: str, item: memoryview | BaseException) -> None:
        if self._stop.is_set():
            raise _Stop
        self._chunks.put((digest, item))

    def _buffer(self) -> bytearray:
        """A free chunk buffer, waiting for the consumer to hand one back."""
        while not self._stop.is_set():
            with contextlib.suppress(queue.Empty):
                return self._free.get(timeout=0.1)
        raise _Stop

    def give_back(self, item: memoryview) -> None:
        if isinstance(item.obj, bytearray):
            self._free.put(item.obj)

    def _run(self) -> None:
        try:
            for blob in self.planned:
                self._read_blob(blob)
        except _Stop:
            return
        except BaseException as err:  # noqa: BLE001  handed to the consumer, which raises it
            with contextlib.suppress(_Stop):
                self._put("", err)

    def _read_blob(self, blob: Planned) -> None:
        try:
            with self.medium.open_file(blob.file) as stream:
                stream.seek(blob.offset)
                while True:
                    buffer = self._buffer()
                    count = stream.readinto(buffer) or 0
                    if not count:
                        self._free.put(buffer)
                        break
                    self.bytes_read += count
                    self._put(blob.digest, memoryview(buffer)[:count])
        except OSError as err:
            self._put(blob.digest, _read_error(blob.file.path, err))
            raise _Stop from err
        except NodeAgentError as err:  # the file on the medium changed since it was checked
            self._put(blob.digest, err)
            raise _Stop from err
        self._put(blob.digest, _END)

    def take(self) -> tuple[str, memoryview | BaseException]:
        return self._chunks.get()

    def source(self, digest: str, offset: int) -> _Source:
        """The blob from ``offset``: prefetched the first time, read directly after that."""
        if digest in self._used:
            return _Direct(self, next(p for p in self.planned if p.digest == digest).file, offset)
        self._used.add(digest)
        return _Queued(self, digest)


def _read_error(path: str, err: OSError) -> HostFileError:
    return HostFileError(f"cannot read {path} on the medium: {err.strerror}")


class _Source:
    def readinto(self, buffer: memoryview, /) -> int:
        raise NotImplementedError


class _Queued(_Source):
    def __init__(self, owner: Prefetcher, digest: str) -> None:
        self.owner, self.digest = owner, digest
        self.chunk = memoryview(b"")
        self.pending = memoryview(b"")
        self.is_done = False

    def readinto(self, buffer: memoryview, /) -> int:
        if not self.pending and not self.is_done:
            self.owner.give_back(self.chunk)
            digest, item = self.owner.take()
            if isinstance(item, BaseException):
                raise item
            if digest != self.digest:
                raise RuntimeError(f"prefetched {digest} while copying {self.digest}")
            self.chunk = self.pending = item
            self.is_done = not item
        count = min(len(buffer), len(self.pending))
        buffer[:count] = self.pending[:count]
        self.pending = self.pending[count:]
        if not self.pending:
            self.owner.give_back(self.chunk)
            self.chunk = memoryview(b"")
        return count


class _Direct(_Source):
    def __init__(self, owner: Prefetcher, file: ExpectedFile, offset: int) -> None:
        self.owner = owner
        self.path = file.path
        self.stream = owner.medium.open_file(file)
        self.stream.seek(offset)

    def readinto(self, buffer: memoryview, /) -> int:
        try:
            count = self.stream.readinto(buffer) or 0
        except OSError as err:
            raise _read_error(self.path, err) from err
        self.owner.bytes_read += count
        if count == 0:
            self.stream.close()
        return count
