"""A verified bundle's blobs, from its medium into the store, in one sequential pass.

``copy_bundle`` is what the importer calls after the signature and tree checks
(``adapters.bundles.intake.check_for_import``): it

1. reads ``bundle.json`` and its signature from the medium once more and verifies them
   (the bytes kept in the store are the bytes verified, and must be the manifest the
   caller checked: a medium swapped meanwhile is refused);
2. plans: the blobs the store lacks (``plan_copy``), stored ones skipped: blobs are kept
   once across bundles;
3. admits, before the first byte: the size cap (``StoreFull``) and the store
   filesystem's free space above ``reserve_bytes`` (``InsufficientDiskSpace``);
4. copies each missing blob once, in the order of its first block on the medium when the
   filesystem says (``FS_IOC_FIEMAP``), else manifest order: each is hashed while written
   (``BlobStore.fill``), and its fsync and rename run in a second thread while the next
   blob is read, so the medium is read without pause; a bad blob refuses the bundle with
   the bundle rule's own code (``BundleDigestMismatch``, ``BundleSizeMismatch``);
5. writes the signed manifest, signature and record, then ``index.json``.

Progress is reported in bytes (``nodeagent.progress``), at most every 2 s and once at the end.
The importer then imports from the store through the loopback server
(``adapters.store.source.served_from_store``): the medium may be removed.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import struct
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from nodeagent.adapters.bundles.tree import (
    BundleDir,
    load_trusted_keys_dir,
    read_signature_files,
    release_signatures,
    verify_signed,
)
from nodeagent.adapters.bundles.trust import kept_signatures
from nodeagent.adapters.files import statvfs_free
from nodeagent.adapters.fips import FIPS_ENABLED_FILE
from nodeagent.adapters.store.accepted import record_accepted
from nodeagent.adapters.store.blobs import CHUNK_BYTES, BlobStore, Filled, StoreLock
from nodeagent.adapters.store.prefetch import Planned, Prefetcher
from nodeagent.adapters.store.records import StoreRecords, record_for
from nodeagent.bundles.ecdsa_signature import ManifestVerified
from nodeagent.bundles.manifest import (
    BundleDigestMismatch,
    BundleIncomplete,
    BundleManifest,
    BundleManifestInvalid,
    BundleSizeMismatch,
    ExpectedFile,
    parse_manifest,
)
from nodeagent.disk import admit
from nodeagent.errors import InsufficientDiskSpace, StoreSourceMismatch
from nodeagent.ports import FilesystemSpace
from nodeagent.progress import ByteProgress, ProgressMeter
from nodeagent.store.keeping import check_cap, size_cap
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

COMMITS_IN_FLIGHT: Final = 4
"""Blobs written and waiting for their fsync and rename while the next is read."""
_FS_IOC_FIEMAP: Final = 0xC020660B
_FIEMAP_HEAD: Final = struct.Struct("=QQIIII")
_FIEMAP_EXTENT: Final = struct.Struct("=QQQQQIIII")


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """What a copy must leave: ``[store]`` caps and the filesystem reserve (``[disk]``)."""

    max_bytes: int = 0
    max_percent: float = 0.0
    reserve_bytes: int = 0


@dataclass(frozen=True, slots=True)
class CopyPlan:
    missing: tuple[tuple[str, ExpectedFile], ...]
    """(digest, file on the medium) of every blob the store lacks, in manifest order."""
    present: int
    """Blobs the store holds already (skipped)."""

    @property
    def missing_bytes(self) -> int:
        return sum(file.size_bytes for _, file in self.missing)


@dataclass(frozen=True, slots=True)
class CopyResult:
    bundle_id: str
    blobs_copied: int
    blobs_present: int
    bytes_copied: int
    """Bytes of the blobs that were missing."""
    bytes_read: int
    """Bytes read from the medium's blobs (less than ``bytes_copied`` after a resume)."""
    seconds: float
    progress: ByteProgress


def plan_copy(store: BlobStore, manifest: BundleManifest) -> CopyPlan:
    """The blobs of ``manifest`` the store does not hold yet (by digest and size)."""
    missing = tuple(
        (digest, file)
        for digest, file in manifest.blobs.items()
        if not store.has(digest, file.size_bytes)
    )
    return CopyPlan(missing, len(manifest.blobs) - len(missing))


def admit_copy(
    store: BlobStore, what: str, missing_bytes: int, limits: StoreLimits
) -> FilesystemSpace:
    """Refuse before the first byte: the size cap, then the filesystem's free space."""
    figures = statvfs_free(store.root)
    space = FilesystemSpace(str(store.root), figures.total_bytes, figures.available_bytes)
    cap = size_cap(limits.max_bytes, limits.max_percent, figures.total_bytes)
    check_cap(what, missing_bytes, sum(store.stored().values()), cap)
    verdict = admit(missing_bytes, space, limits.reserve_bytes)
    if not verdict.is_admitted:
        raise InsufficientDiskSpace(f"{what} into the image store {verdict.describe()}")
    return space


def physical_offset(fd: int) -> int | None:
    """Where the file's first extent starts on its device; None when not known (FIEMAP)."""
    request = bytearray(_FIEMAP_HEAD.size + _FIEMAP_EXTENT.size)
    _FIEMAP_HEAD.pack_into(request, 0, 0, (1 << 64) - 1, 0, 0, 1, 0)
    try:
        fcntl.ioctl(fd, _FS_IOC_FIEMAP, request)
    except OSError:
        return None
    mapped = _FIEMAP_HEAD.unpack_from(request)[3]
    if not mapped:
        return None
    physical: int = _FIEMAP_EXTENT.unpack_from(request, _FIEMAP_HEAD.size)[1]
    return physical


def disk_order(
    medium: BundleDir, missing: tuple[tuple[str, ExpectedFile], ...]
) -> list[tuple[str, ExpectedFile]]:
    """``missing`` sorted by first block on the medium; manifest order where it is unknown."""
    keyed = []
    for position, (digest, file) in enumerate(missing):
        with medium.open_file(file) as stream:
            offset = physical_offset(stream.fileno())
        keyed.append(((0, offset, position) if offset is not None else (1, 0, position), digest))
    by_digest = dict(missing)
    return [(digest, by_digest[digest]) for _, digest in sorted(keyed)]


class CopyStopped(Exception):
    """The copy stopped because ``should_stop`` said so; nothing was recorded."""


@dataclass(frozen=True, slots=True)
class SignedFiles:
    """``bundle.json`` and its signature files as bytes, verified, and the manifest (the
    signature files: those verified, ``trust.kept_signatures``)."""

    manifest: BundleManifest
    verified: ManifestVerified
    data: bytes
    minisig: bytes | None
    ecdsa: bytes | None


def read_signed(
    medium_root: Path, trusted_keys_dir: Path, *, fips_switch: Path = FIPS_ENABLED_FILE
) -> SignedFiles:
    """``bundle.json`` and its signatures as bytes, verified, and the manifest they hold."""
    try:
        data, minisig, ecdsa = read_signature_files(medium_root)
    except BundleIncomplete:
        raise BundleIncomplete(f"{medium_root} lost its bundle.json") from None
    keys = load_trusted_keys_dir(trusted_keys_dir, fips_switch=fips_switch)
    verified = verify_signed(data, minisig, ecdsa, keys)
    return SignedFiles(
        parse_manifest(data), verified, data, *kept_signatures(verified, minisig, ecdsa)
    )


class _Committer:
    """fsync and rename finished blobs in one worker thread, a bounded number in flight."""

    def __init__(self, store: BlobStore, on_stored: Callable[[str], None]) -> None:
        self.store = store
        self.on_stored = on_stored
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-commit")
        self.pending: deque[Future[None]] = deque()

    def submit(self, filled: Filled) -> None:
        while len(self.pending) >= COMMITS_IN_FLIGHT:
            self.pending.popleft().result()
        self.pending.append(self.pool.submit(self._commit, filled))

    def _commit(self, filled: Filled) -> None:
        self.store.commit(filled)
        self.on_stored(filled.digest)

    def drain(self) -> None:
        """Wait for every commit; the first failure raises (after all have ended)."""
        try:
            while self.pending:
                self.pending.popleft().result()
        finally:
            self.pool.shutdown(wait=True)


def copy_bundle(
    store_root: Path,
    medium_root: Path,
    manifest: BundleManifest,
    trusted_keys_dir: Path,
    *,
    limits: StoreLimits = StoreLimits(),
    on_progress: Callable[[ByteProgress], None] = lambda _p: None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    chunk_bytes: int = CHUNK_BYTES,
    fips_switch: Path = FIPS_ENABLED_FILE,
    should_stop: Callable[[], bool] = lambda: False,
    on_admitted: Callable[[], None] = lambda: None,
    on_stored: Callable[[str], None] = lambda _digest: None,
) -> CopyResult:
    """Copy every blob of the verified ``manifest`` the store lacks from ``medium_root``.

    ``on_admitted`` is called once the medium's manifest was verified again and the copy
    admitted (cap and free space), before the first blob: the importer starts its pulls
    then (decision 0079). ``on_stored`` is called (from a worker thread) with each blob's
    digest once it is stored: an image is pulled once all of its are (decision 0081).

    ``should_stop`` is asked as each chunk is written: once it says yes (the import that
    asked for the copy was cancelled: its medium went away, or the daemon stops) the copy
    raises ``CopyStopped`` and records nothing; what is stored stays, a blob's partial
    included, and the next copy resumes it."""
    started_s = clock()
    files = read_signed(medium_root, trusted_keys_dir, fips_switch=fips_switch)
    verified, data = files.verified, files.data
    if files.manifest != manifest:
        raise BundleManifestInvalid(
            f"bundle.json on {medium_root} is no longer the one verified; plug the medium in again"
        )
    store = BlobStore(store_root, chunk_bytes=chunk_bytes)
    records = StoreRecords(store_root)
    with StoreLock(store_root):
        store.ensure()
        records.ensure_layout()
        plan = plan_copy(store, manifest)
        if plan.missing:  # nothing to copy: the record alone, whatever the space left
            admit_copy(store, f"bundle {manifest.bundle_id}", plan.missing_bytes, limits)
        on_admitted()
        resumed = {d: size for d, (size, _) in store.partials().items() if d in dict(plan.missing)}
        meter = ProgressMeter(plan.missing_bytes, started_s, done_bytes=sum(resumed.values()))
        log.info(
            "store_copy_started",
            bundle=manifest.bundle_id,
            blobs=len(plan.missing),
            present=plan.present,
            bytes=format_bytes(plan.missing_bytes),
        )

        def on_bytes(count: int) -> None:
            if should_stop():
                raise CopyStopped(manifest.bundle_id)
            _tick(meter, count, clock, on_progress)

        with BundleDir(medium_root) as medium:
            try:
                read_bytes = _copy_blobs(
                    store, medium, disk_order(medium, plan.missing), on_bytes, on_stored
                )
            except CopyStopped:
                done = meter.finish(clock())
                log.info(
                    "store_copy_stopped",
                    bundle=manifest.bundle_id,
                    stored=format_bytes(done.done_bytes),
                    of=format_bytes(plan.missing_bytes),
                )
                raise
            extra = release_signatures(medium, manifest)
        record = record_for(
            manifest,
            verified.key_id_hex,
            verified.key_name or "",
            records.top_manifest_types(manifest),
            wall_clock(),
        )
        records.write_bundle(record, data, files.minisig, extra, ecdsa=files.ecdsa)
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        record_accepted(store_root, manifest.stamp(verified.key_id_hex, digest, verified.linked))
        loaded = records.load()
        records.refresh_index(loaded.records, set(store.stored()))
    final = meter.finish(clock())
    on_progress(final)
    seconds = clock() - started_s
    log.info(
        "store_copy_finished",
        bundle=manifest.bundle_id,
        blobs=len(plan.missing),
        bytes=format_bytes(plan.missing_bytes),
        read=format_bytes(read_bytes),
        seconds=round(seconds, 1),
    )
    return CopyResult(
        manifest.bundle_id,
        len(plan.missing),
        plan.present,
        plan.missing_bytes,
        read_bytes,
        seconds,
        final,
    )


def _tick(
    meter: ProgressMeter,
    count: int,
    clock: Callable[[], float],
    on_progress: Callable[[ByteProgress], None],
) -> None:
    shown = meter.advance(count, clock())
    if shown is not None:
        on_progress(shown)


def _copy_blobs(
    store: BlobStore,
    medium: BundleDir,
    ordered: list[tuple[str, ExpectedFile]],
    on_bytes: Callable[[int], None],
    on_stored: Callable[[str], None],
) -> int:
    """Copy ``ordered`` (read ahead in a thread, committed in another); the bytes read."""
    partials = store.partials()
    planned = [
        Planned(digest, file, _resume_offset(partials.get(digest), file.size_bytes))
        for digest, file in ordered
    ]
    prefetcher = Prefetcher(medium, planned, store.chunk_bytes)
    committer = _Committer(store, on_stored)
    prefetcher.start()
    try:
        for blob in planned:
            opener = functools.partial(prefetcher.source, blob.digest)
            try:
                filled = store.fill(blob.digest, blob.file.size_bytes, opener, on_bytes)
            except StoreSourceMismatch as err:
                kind = BundleSizeMismatch if err.is_size else BundleDigestMismatch
                raise kind(f"{blob.file.path}: {err.message}") from err
            committer.submit(filled)
    finally:
        prefetcher.close()
        store.close()
        committer.drain()
    return prefetcher.bytes_read


def _resume_offset(partial: tuple[int, float] | None, size_bytes: int) -> int:
    """Where ``BlobStore.fill`` resumes: the partial's size, unless it is too long."""
    return partial[0] if partial is not None and partial[0] <= size_bytes else 0
