"""Registry sets into the node's image store: each blob fetched once, streamed, verified.

``RegistrySets`` is ``sync.copies.RegistryStore`` (``[store] registry_sets``). For each set
loaded from a spec (a set a stored bundle carried is left to its bundle), the images to
fetch are planned as ``nodeagent bundle create`` plans them (``adapters.bundles.fetcher``:
the manifest its digest names, for an index also this node's platform child, the config,
the layers). Manifests (bounded, a few KB) are read whole to be parsed, from the store
when it holds them; the plan's missing bytes are admitted before the first blob is
fetched or written (the ``[store]`` cap, then the store filesystem's free space minus the
``[disk]`` reserve, plus what the runtime's images need when both share that
filesystem). Each blob then streams from the registry client's worker thread through a
bounded queue into ``BlobStore.fill`` (hashed while written, renamed into ``blobs/`` by
``commit`` only when its digest matches). Last the set's record (``sets/<name>/``) and
``index.json`` are written. The image config (bounded) is read whole too, first, and
must be for this node's platform before the image's other blobs are written. One writer
at a time: the store lock is held for the pass.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import io
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nodeagent.adapters.bundles.fetcher import Descriptor, image_blobs, index_child, top_descriptor
from nodeagent.adapters.files import statvfs_free
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.adapters.store.blobs import BlobStore, StoreLock
from nodeagent.adapters.store.copier import StoreLimits
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.bundles.content import IMAGE_CONFIG_TYPES
from nodeagent.disk import admit
from nodeagent.errors import ImageNotFound, InsufficientDiskSpace, NodeAgentError
from nodeagent.ports import FilesystemSpace, RegistryCredentials
from nodeagent.references import parse_pinned_image_ref
from nodeagent.registries import (
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    Platform,
    read_image_config_platform,
)
from nodeagent.status import DiskStatus
from nodeagent.store.keeping import check_cap, size_cap
from nodeagent.store.layout import (
    BlobRef,
    BundleRecord,
    StoredImage,
    is_set_name,
    registry_record,
)
from nodeagent.strict import clip
from nodeagent.sync.copies import SetImages, StoredFromRegistry, StoreFailure

QUEUED_CHUNKS: Final = 8
"""Chunks waiting between the registry download and the store write (a few MB at most)."""


class _FetchStopped(Exception):
    """The download ended before the blob did; the partial file is discarded."""


class ChunkPipe:
    """The registry client writes chunks (its worker thread); ``BlobStore.fill`` reads them
    (another): at most ``queued`` (default ``QUEUED_CHUNKS``) wait, so a blob is never whole
    in memory. ``end``
    is called once the download returned, with its error if it failed; the reader then
    sees the end of the blob, or ``_FetchStopped``. A reader that stopped (``close_reader``)
    makes the next write fail at once, so the download does not wait for it."""

    def __init__(self, queued: int = QUEUED_CHUNKS) -> None:
        self._queued = queued
        self._ready = threading.Condition()
        self._chunks: deque[bytes] = deque()
        self._left = memoryview(b"")
        self._is_reader_gone = False
        self._is_ended = False
        self._error: BaseException | None = None

    def write(self, data: bytes) -> int:
        with self._ready:
            while len(self._chunks) >= self._queued and not self._is_reader_gone:
                self._ready.wait()
            if self._is_reader_gone:
                raise BrokenPipeError(errno.EPIPE, "the store stopped reading this blob")
            self._chunks.append(bytes(data))
            self._ready.notify_all()
        return len(data)

    def end(self, error: BaseException | None = None) -> None:
        with self._ready:
            self._is_ended, self._error = True, error
            self._ready.notify_all()

    def close_reader(self) -> None:
        with self._ready:
            self._is_reader_gone = True
            self._ready.notify_all()

    def readinto(self, buffer: memoryview) -> int:
        if not self._left:
            with self._ready:
                while not self._chunks and not self._is_ended:
                    self._ready.wait()
                if not self._chunks:
                    if self._error is not None:
                        raise _FetchStopped(str(self._error)) from self._error
                    return 0
                self._left = memoryview(self._chunks.popleft())
                self._ready.notify_all()
        count = min(len(buffer), len(self._left))
        buffer[:count] = self._left[:count]
        self._left = self._left[count:]
        return count


@dataclass(frozen=True, slots=True)
class _Planned:
    """One image: its top manifest, and every blob (manifests with their bytes; the image
    config, read and checked for the platform when it is written; the rest streamed)."""

    image: StoredImage
    small: dict[str, tuple[Descriptor, bytes]]
    config: Descriptor | None
    streamed: dict[str, Descriptor]

    @property
    def descriptors(self) -> list[Descriptor]:
        config = [self.config] if self.config is not None else []
        return [d for d, _ in self.small.values()] + config + list(self.streamed.values())

    @property
    def blobs(self) -> tuple[BlobRef, ...]:
        return tuple(BlobRef(d.digest, d.size_bytes) for d in self.descriptors)


CredentialsFor = Callable[[str], RegistryCredentials | None]


class RegistrySets:
    """``sync.copies.RegistryStore`` over the store at ``root`` and the registry client."""

    def __init__(
        self,
        root: Path,
        client: RegistryClient,
        credentials_for: CredentialsFor,
        platform: Platform,
        limits: StoreLimits,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root, self.client, self.credentials_for = root, client, credentials_for
        self.platform, self.limits, self.clock = platform, limits, clock
        self.blobs = BlobStore(root)
        self.records = StoreRecords(root)

    async def store(
        self, sets: Sequence[SetImages], images_need: DiskStatus | None
    ) -> StoredFromRegistry:
        loaded = await asyncio.to_thread(self.records.load, is_repairing=False)
        if not any(self._has_work(s, loaded.records) for s in sets):
            return StoredFromRegistry()
        lock = StoreLock(self.root)
        await _acquire(lock)
        try:
            return await self._store_locked(sets, images_need)
        finally:
            lock.__exit__(None, None, None)

    def _has_work(self, wanted: SetImages, records: Sequence[BundleRecord]) -> bool:
        if not is_set_name(wanted.name):
            return False  # specs admit DNS subdomains only; anything else has no record path
        if any(not r.is_registry and wanted.name in r.sets for r in records):
            return False  # a bundle's set: its blobs come with the bundle
        previous = next((r for r in records if r.is_registry and r.bundle_id == wanted.name), None)
        keep = set(wanted.refs) | set(wanted.pinned)
        is_pruned = previous is not None and any(i.name not in keep for i in previous.images)
        return bool(wanted.missing) or is_pruned

    async def _store_locked(
        self, sets: Sequence[SetImages], images_need: DiskStatus | None
    ) -> StoredFromRegistry:
        await asyncio.to_thread(self._ensure)
        records = (await asyncio.to_thread(self.records.load)).records
        stored: list[str] = []
        fetched = 0
        failures: list[StoreFailure] = []
        for wanted in sets:
            if not self._has_work(wanted, records):
                continue
            try:
                refs, count = await self._store_set(wanted, records, images_need)
            except NodeAgentError as err:
                failures.append(StoreFailure(wanted.name, err.reason, clip(err.message, 600)))
                continue
            stored.extend(refs)
            fetched += count
        await asyncio.to_thread(self._refresh_index)
        return StoredFromRegistry(tuple(stored), fetched, tuple(failures))

    def _refresh_index(self) -> None:
        self.records.refresh_index(self.records.load().records, set(self.blobs.stored()))

    def _ensure(self) -> None:
        self.blobs.ensure()
        self.records.ensure_layout()

    async def _store_set(
        self, wanted: SetImages, records: Sequence[BundleRecord], images_need: DiskStatus | None
    ) -> tuple[list[str], int]:
        previous = next((r for r in records if r.is_registry and r.bundle_id == wanted.name), None)
        keep = (set(wanted.refs) | set(wanted.pinned)) - set(wanted.missing)
        retained = [i for i in previous.images if i.name in keep] if previous else []
        plans = [await self._plan(ref) for ref in wanted.missing]
        kept_plans = [plan for i in retained if (plan := await self._plan_stored(i.name))]
        missing = await asyncio.to_thread(self._missing, plans)
        need = sum(d.size_bytes for d in missing.values())
        if need:  # pruning alone adds nothing, even to a store over a lowered cap
            await asyncio.to_thread(self._admit, wanted.name, need, images_need)
        for plan in plans:
            await self._write(plan, missing)
        now_s = self.clock()
        record = registry_record(
            wanted.name,
            [p.image for p in (*kept_plans, *plans)],
            [b for p in (*kept_plans, *plans) for b in p.blobs],
            dt.datetime.fromtimestamp(now_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            now_s,
        )
        await asyncio.to_thread(self.records.write_set, record)
        return list(wanted.missing), need

    def _missing(self, plans: Sequence[_Planned]) -> dict[str, Descriptor]:
        every = {d.digest: d for p in plans for d in p.descriptors}
        return {k: d for k, d in every.items() if not self.blobs.has(d.digest, d.size_bytes)}

    def _admit(self, set_name: str, need_bytes: int, images_need: DiskStatus | None) -> None:
        """Refuse before the first byte: the store's cap, then its filesystem's free space
        (with the runtime's need when the images land on the same filesystem)."""
        what = f"set {set_name} from its registry"
        figures = statvfs_free(self.root)
        cap = size_cap(self.limits.max_bytes, self.limits.max_percent, figures.total_bytes)
        check_cap(what, need_bytes, sum(self.blobs.stored().values()), cap)
        also = 0
        if images_need is not None and _same_filesystem(self.root, images_need.mountpoint):
            also = images_need.needed_bytes
        space = FilesystemSpace(str(self.root), figures.total_bytes, figures.available_bytes)
        verdict = admit(need_bytes + also, space, self.limits.reserve_bytes)
        if not verdict.is_admitted:
            raise InsufficientDiskSpace(f"{what} into the image store {verdict.describe()}")

    # ------------------------------------------------------------ planning
    async def _plan_stored(self, text: str) -> _Planned | None:
        """An image the set's record keeps, from the store alone; None: no longer whole."""
        try:
            return await self._plan(text, is_offline=True)
        except NodeAgentError:
            return None  # fetched again from its registry when the runtime lacks it

    async def _plan(self, text: str, *, is_offline: bool = False) -> _Planned:
        """What ``text``'s digest names, for this node's platform; small blobs read whole
        (from the store when it holds them, else the registry unless ``is_offline``)."""
        ref = parse_pinned_image_ref(text)
        body = await self._small(text, ref.digest, None, is_offline=is_offline)
        top = top_descriptor(ref.digest, body, ref)
        small = {top.digest: (top, body)}
        child = index_child(body, self.platform, ref)
        if child is not None:
            body = await self._small(text, child.digest, child.size_bytes, is_offline=is_offline)
            small[child.digest] = (child, body)
        config, *layers = image_blobs(body, ref)
        streamed = {d.digest: d for d in layers if d.digest not in small}
        checked: Descriptor | None = config
        if config.media_type not in IMAGE_CONFIG_TYPES:
            streamed[config.digest], checked = config, None
        elif config.size_bytes > MAX_CONFIG_BYTES:
            raise ImageNotFound(f"{ref}: its image config is larger than a runtime reads")
        image = StoredImage(text, top.digest, top.size_bytes, top.media_type)
        return _Planned(image, small, checked, streamed)

    async def _checked_config(self, text: str, config: Descriptor) -> bytes:
        """The image config (store or registry), refused unless it is for this node."""
        body = await self._small(
            text, config.digest, config.size_bytes, is_offline=False, is_blob=True
        )
        found = read_image_config_platform(body, ref=text)
        if found != (self.platform.os, self.platform.architecture):
            raise ImageNotFound(
                f"{clip(text, 300)} is a {clip(found[0], 64)}/{clip(found[1], 64)} image and "
                f"this node is {self.platform}: pin the digest of its {self.platform} image"
            )
        return body

    async def _small(
        self,
        text: str,
        digest: str,
        size_bytes: int | None,
        *,
        is_offline: bool,
        is_blob: bool = False,
    ) -> bytes:
        bound = size_bytes if size_bytes is not None else MAX_MANIFEST_BYTES
        if await asyncio.to_thread(self.blobs.size_of, digest) is not None:
            return await asyncio.to_thread(self._read_stored, digest, bound)
        if is_offline:
            raise ImageNotFound(f"{text}: blob {digest} is no longer in the store")
        sink = io.BytesIO()
        await self.client.fetch_to(
            text, digest, sink, self.credentials_for(text), max_bytes=bound, is_manifest=not is_blob
        )
        body = sink.getvalue()
        if size_bytes is not None and len(body) != size_bytes:
            raise ImageNotFound(
                f"{text}: {digest} is {len(body)} bytes, its descriptor says {bound}"
            )
        return body

    def _read_stored(self, digest: str, bound: int) -> bytes:
        with self.blobs.open_verified(digest) as blob:
            if blob.size_bytes > bound:
                raise ImageNotFound(f"stored blob {digest} is larger than its descriptor says")
            buffer = bytearray(blob.size_bytes + 1)
            view = memoryview(buffer)
            done = 0
            while count := blob.readinto(view[done:]):
                done += count
            return bytes(buffer[:done])

    # ------------------------------------------------------------ writing
    async def _write(self, plan: _Planned, missing: dict[str, Descriptor]) -> None:
        """The config first (checked for this node's platform), the manifests, the rest."""
        if plan.config is not None:
            body = await self._checked_config(plan.image.name, plan.config)
            if plan.config.digest in missing:
                await asyncio.to_thread(self._fill_bytes, plan.config, body)
                missing.pop(plan.config.digest)
        for digest, (descriptor, body) in plan.small.items():
            if digest in missing:
                await asyncio.to_thread(self._fill_bytes, descriptor, body)
                missing.pop(digest)
        for digest, descriptor in plan.streamed.items():
            if digest in missing:
                await self._fill_streamed(plan.image.name, descriptor)
                missing.pop(digest)

    def _fill_bytes(self, descriptor: Descriptor, body: bytes) -> None:
        self.blobs.remove_partial(descriptor.digest)
        filled = self.blobs.fill(
            descriptor.digest, descriptor.size_bytes, lambda _offset: io.BytesIO(body)
        )
        self.blobs.commit(filled)

    async def _fill_streamed(self, text: str, descriptor: Descriptor) -> None:
        """Download into the blob's partial file while it is hashed; stored once it matches."""
        digest, size_bytes = descriptor.digest, descriptor.size_bytes
        await asyncio.to_thread(self.blobs.remove_partial, digest)  # offset 0: read it once
        pipe = ChunkPipe()

        def fill() -> None:
            try:
                filled = self.blobs.fill(digest, size_bytes, lambda _offset: pipe)
            finally:
                pipe.close_reader()
            self.blobs.commit(filled)

        filling = asyncio.ensure_future(asyncio.to_thread(fill))
        try:
            await self.client.fetch_to(
                text, digest, pipe, self.credentials_for(text), max_bytes=size_bytes
            )
        except BaseException as err:
            pipe.end(err)
            cause = await _settle(filling)
            await asyncio.to_thread(self.blobs.remove_partial, digest)
            if cause is not None:  # the store stopped first (no space, a write error)
                raise cause from err
            raise
        pipe.end()
        await filling


async def _acquire(lock: StoreLock) -> None:
    """Take the store lock in a worker thread; cancelled while waiting, it is released as
    soon as the thread gets it (never held by nobody)."""
    taking = asyncio.ensure_future(asyncio.to_thread(lock.__enter__))
    try:
        await asyncio.shield(taking)
    except asyncio.CancelledError:
        taking.add_done_callback(lambda _done: lock.__exit__(None, None, None))
        raise


async def _settle(filling: asyncio.Future[None]) -> NodeAgentError | None:
    """Wait for a fill whose download failed: the store's own error, if it stopped first."""
    try:
        await asyncio.shield(filling)
    except _FetchStopped:
        return None
    except NodeAgentError as err:
        return err
    return None


def _same_filesystem(root: Path, other: str) -> bool:
    """Whether ``root`` (or its nearest existing ancestor) is on the filesystem of ``other``."""
    current = root.absolute()
    while not current.exists() and current.parent != current:
        current = current.parent
    try:
        return current.stat().st_dev == Path(other).stat().st_dev
    except OSError:
        return True  # not known: count both, as if they shared it
