"""The bundle Importer with the node's image store: stick to store first, then the import
runs from the store and the medium may leave (issue 14).

The importer and its rig are those of ``test_importer`` (fake runtime, server, mirror,
reloader, space); the store is ``MemoryImageStore``, which holds digests in memory,
reports progress as the real copier does, and can fail as the real one fails.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import pytest

from nodeagent.bundles.manifest import BundleManifest, ExpectedFile
from nodeagent.errors import BundleDigestMismatch, NodeAgentError, StoreFull
from nodeagent.progress import ByteProgress
from tests.service.test_importer import APP, BLOB_BYTES, DB, GIB, MIB, ROOT, TOTAL, Rig
from tests.testenv.waiting import wait_for_async

STORE = Path("/var/lib/nodeagent/store")
IMAGE_LAYERS = {"sha256:" + "1" * 64: "3", "sha256:" + "2" * 64: "4"}
"""The rig's two images (their digests are blobs 1 and 2) and the layer each names."""


def image_manifest(layer: str) -> bytes:
    """An OCI image manifest whose one layer is blob ``layer`` of the rig."""
    descriptor = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                  "digest": "sha256:" + layer * 64, "size": BLOB_BYTES[layer]}  # fmt: skip
    config = {"mediaType": "application/vnd.oci.image.config.v1+json",
              "digest": "sha256:" + layer * 64, "size": BLOB_BYTES[layer]}  # fmt: skip
    media_type = "application/vnd.oci.image.manifest.v1+json"
    body = {"schemaVersion": 2, "mediaType": media_type, "config": config, "layers": [descriptor]}
    return json.dumps(body).encode()


class MemoryImageStore:
    """``importer.ImageStorePort`` in memory."""

    def __init__(self, rig: Rig, *, held: set[str] | None = None, shares: bool = False) -> None:
        self.rig = rig
        self.held = set(held or ())
        self.shares = shares
        self.error: NodeAgentError | None = None
        self.copies = 0
        self.copied_bytes = 0
        self.remove_medium_after_copy = False
        self.discarded: set[str] = set()

    @property
    def root(self) -> Path:
        return STORE

    def missing_bytes(self, manifest: BundleManifest) -> int:
        return sum(f.size_bytes for d, f in manifest.blobs.items() if d not in self.held)

    def shares_filesystem(self, path: str) -> bool:
        return self.shares

    def copy(
        self,
        medium: Path,
        manifest: BundleManifest,
        on_progress: Callable[[ByteProgress], None],
        should_stop: Callable[[], bool] = lambda: False,
        *,
        on_admitted: Callable[[], None] = lambda: None,
        on_stored: Callable[[str], None] = lambda _digest: None,
    ) -> object:
        assert medium == ROOT and self.rig.is_present
        if self.error is not None:
            raise self.error
        on_admitted()
        self.copies += 1
        total = self.missing_bytes(manifest)
        self.copied_bytes += total
        on_progress(ByteProgress(total // 2, total, 40e6, total / 2 / 40e6, 1.0))
        for digest in sorted(set(manifest.blobs) - self.held):
            self.held.add(digest)
            on_stored(digest)
        on_progress(ByteProgress(total, total, 40e6, 0.0, 2.0, is_final=True))
        if self.remove_medium_after_copy:
            self.rig.is_present = False
        return None

    def served_files(self, manifest: BundleManifest) -> dict[str, ExpectedFile]:
        return {
            d: ExpectedFile(f"blobs/sha256/{d.removeprefix('sha256:')}", f.size_bytes, d[7:])
            for d, f in manifest.blobs.items()
        }

    def has_blob(self, digest: str) -> bool:
        return digest in self.held

    def read_manifest(self, digest: str) -> bytes | None:
        """APP's manifest names layer 3, DB's layer 4; the other blobs are layers."""
        layer = IMAGE_LAYERS.get(digest)
        return None if layer is None or digest not in self.held else image_manifest(layer)

    def discard(self, digests: Iterable[str]) -> tuple[int, int]:
        gone = set(digests) & self.held
        self.held -= gone
        self.discarded |= gone
        return len(gone), sum(BLOB_BYTES[d[7]] for d in gone)


def with_store(rig: Rig, **kwargs: object) -> MemoryImageStore:
    store = MemoryImageStore(rig, **kwargs)  # type: ignore[arg-type]
    rig.importer.ports.image_store = store
    return store


async def test_the_bundle_is_stored_first_then_imported_from_the_store_without_the_medium() -> None:
    rig = Rig()
    store = with_store(rig)
    store.remove_medium_after_copy = True  # pulled out as soon as "may be removed" appears

    report = await rig.run()

    assert rig.states() == [
        "detected", "verified", "admitted", "storing", "storing", "storing", "stored",
        "importing", "imported",
    ]  # fmt: skip
    stored = rig.reports[6]
    assert stored.is_medium_removable and stored.to_json()["mediumRemovable"] is True
    progress = rig.reports[4].to_json()["progress"]
    assert progress["doneBytes"] == TOTAL // 2
    assert progress["totalBytes"] == TOTAL
    assert "MB/s" in progress["text"]
    assert rig.servers[0].root == STORE  # served from the store, not the medium
    assert sorted(rig.crio.pull_calls) == [APP, DB]
    assert report.state == "imported" and report.sets == ("apps", "db")
    assert store.copies == 1


async def test_a_store_that_holds_the_bundle_copies_nothing_and_frees_the_medium_at_once() -> None:
    """No byte to copy, no ``storing`` step; the bundle is still recorded (the copy runs and
    writes its signed manifest and record): a newer bundle of the same images, e.g. one that
    serves a tag, must be in the store for its tags to be served."""
    rig = Rig()
    store = with_store(rig, held={"sha256:" + h * 64 for h in BLOB_BYTES})

    report = await rig.run()

    assert store.copies == 1 and store.copied_bytes == 0
    assert "storing" not in rig.states()
    assert "stored" in rig.states()
    assert report.state == "imported"


async def test_a_full_store_refuses_the_bundle_before_anything_is_pulled_or_applied() -> None:
    rig = Rig()
    store = with_store(rig)
    store.error = StoreFull("bundle line-3 needs 500 MiB; the store's cap of 100 MiB is reached")

    report = await rig.run()

    assert (report.state, report.reason) == ("rejected", "StoreFull")
    assert rig.crio.pull_calls == []
    assert rig.specs.files == {}
    assert rig.servers == []


async def test_store_and_images_on_one_filesystem_are_admitted_together() -> None:
    # 1.4 GiB free: the unpacked images (2 x 500 MiB) fit with the 1 GiB reserve only
    # without the store's copy of 500 MiB on the same filesystem.
    images_need = 2 * TOTAL  # expansion factor 2
    free = images_need + GIB + 100 * MIB
    rig = Rig(available_bytes=free)
    with_store(rig, shares=True)
    refused = await rig.run()
    assert (refused.state, refused.reason) == ("rejected", "InsufficientDiskSpace")
    assert rig.crio.pull_calls == []

    apart = Rig(available_bytes=free)
    with_store(apart, shares=False)
    assert (await apart.run()).state == "imported"


class SlowStore(MemoryImageStore):
    """Its copy waits for the test in its worker thread, then reports progress."""

    def __init__(self, rig: Rig) -> None:
        super().__init__(rig)
        self.started = threading.Event()
        self.go_on = threading.Event()
        self.reported = threading.Event()
        self.told_to_stop: bool | None = None

    def copy(
        self,
        medium: Path,
        manifest: BundleManifest,
        on_progress: Callable[[ByteProgress], None],
        should_stop: Callable[[], bool] = lambda: False,
        *,
        on_admitted: Callable[[], None] = lambda: None,
        on_stored: Callable[[str], None] = lambda _digest: None,
    ) -> object:
        on_admitted()
        self.started.set()
        self.go_on.wait(timeout=10)
        self.told_to_stop = should_stop()  # what the real copy asks before each chunk
        total = self.missing_bytes(manifest)
        on_progress(ByteProgress(total, total, 40e6, 0.0, 2.0, is_final=True))
        self.reported.set()
        return None


async def test_a_cancelled_import_s_copy_reports_no_progress_after_it_stopped() -> None:
    """The medium removed during the copy cancels the import; the copy's thread is told to
    stop (the real copy stops at its next chunk), and what it reports meanwhile must not
    overwrite "interrupted"."""
    rig = Rig()
    store = SlowStore(rig)
    rig.importer.ports.image_store = store
    running = asyncio.create_task(rig.run())
    await asyncio.to_thread(store.started.wait, 10)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    shown = len(rig.reports)
    store.go_on.set()
    await asyncio.to_thread(store.reported.wait, 10)
    for _ in range(3):  # the loop runs what the thread scheduled (call_soon_threadsafe)
        await asyncio.sleep(0)

    assert len(rig.reports) == shown
    assert rig.states()[-1] == "storing"
    assert store.told_to_stop is True


class GatedStore(MemoryImageStore):
    """Admitted at once; then its copy stores the blobs one at a time in ``order``, each once
    the test lets it (``allow``), as a long copy of a real medium would, and raises
    ``failure`` where ``None`` stands in the order."""

    def __init__(
        self, rig: Rig, order: list[str | None], *, failure: NodeAgentError | None = None
    ) -> None:
        super().__init__(rig)
        self.order = order
        self.allowed = threading.Semaphore(0)
        self.failure = failure

    def allow(self, count: int = 1) -> None:
        for _ in range(count):
            self.allowed.release()

    def copy(
        self,
        medium: Path,
        manifest: BundleManifest,
        on_progress: Callable[[ByteProgress], None],
        should_stop: Callable[[], bool] = lambda: False,
        *,
        on_admitted: Callable[[], None] = lambda: None,
        on_stored: Callable[[str], None] = lambda _digest: None,
    ) -> object:
        on_admitted()
        for blob in self.order:
            assert self.allowed.acquire(timeout=10), "the test never let the copy go on"
            if blob is None and self.failure is not None:
                raise self.failure
            if blob is not None:
                self.held.add("sha256:" + blob * 64)
                on_stored("sha256:" + blob * 64)
        total = self.missing_bytes(manifest)
        on_progress(ByteProgress(total, total, 40e6, 0.0, 2.0, is_final=True))
        return None


def pulled(rig: Rig, *refs: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return sorted(rig.crio.pull_calls) == sorted(refs)

    return check


async def test_each_image_is_pulled_once_its_blobs_are_stored_while_the_copy_runs() -> None:
    """Decisions 0079 and 0081: the pulls run while the copy does, each image's once every
    blob it needs is stored (its manifest, then the layers the manifest names); the status
    still says storing, stored, then importing."""
    rig = Rig()
    store = GatedStore(rig, ["1", "2", "3", "4"])
    rig.importer.ports.image_store = store
    running = asyncio.create_task(rig.run())
    try:
        store.allow(3)  # both manifests and APP's layer
        await wait_for_async(pulled(rig, APP), timeout_s=10, what="APP pulled, its blobs stored")
        assert DB not in rig.crio.pull_calls  # its layer is not stored yet
        assert "importing" not in rig.states()  # the pulls' reports wait for the copy
    finally:
        store.allow()
    report = await running

    assert report.state == "imported"
    assert sorted(rig.crio.pull_calls) == [APP, DB]
    states = rig.states()
    assert states[-4:] == ["storing", "stored", "importing", "imported"]
    assert rig.servers[0].root == STORE and rig.servers[0].calls == ["start", "close"]


async def test_a_copy_refused_midway_starts_no_other_pull_and_takes_everything_back() -> None:
    """A blob of the medium fails its digest once APP is in: DB, whose layer never came,
    is never pulled (no layer of it reaches the runtime), APP is removed again and the
    blobs the copy stored are discarded: a refused bundle leaves nothing behind."""
    rig = Rig()
    damaged = BundleDigestMismatch("blobs/sha256/44… does not match bundle.json")
    store = GatedStore(rig, ["1", "3", "2", None], failure=damaged)
    rig.importer.ports.image_store = store
    running = asyncio.create_task(rig.run())
    try:
        store.allow(3)
        await wait_for_async(pulled(rig, APP), timeout_s=10, what="APP pulled during the copy")
    finally:
        store.allow()
    report = await running

    assert (report.state, report.reason) == ("rejected", "BundleDigestMismatch")
    assert rig.crio.pull_calls == [APP]
    assert [await rig.crio.image_status(ref) for ref in (APP, DB)] == [None, None]
    assert store.discarded == {"sha256:" + h * 64 for h in "132"}
    assert store.held == set()
    assert rig.specs.files == {}
    assert rig.servers[0].calls == ["start", "close"]
    assert "importing" not in rig.states()
