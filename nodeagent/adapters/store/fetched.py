"""A bundle fetched from peers, into the store: what ``site.fetcher.BundleFetcher`` writes with.

In order (docs/site.md, "Fetch"; docs/store.md):

1. ``verify``: the ``bundle.json`` and signature files a peer sent are checked against this
   node's own trusted keys, exactly as a stick's (``trust.verify_signed``: decision 0075's
   rule, no legacy minisign signatures; then ``parse_manifest``): a peer is never trusted;
2. ``begin``, under the store lock: the store's admission (``copier.admit_copy``: the size
   cap, ``StoreFull``, then the filesystem's free space above the reserve,
   ``InsufficientDiskSpace``), then ``bundle.json`` and its signature are written. From
   then on the bundle directory (signed manifest, no record) is a fetch under way: the
   holdings list it as started, the peer server offers the blobs of it that are stored,
   and the keeper keeps them and their partials (``fetching_digests``);
3. ``fill``, per blob: ``BlobStore.fill`` hashes the bytes while it writes them to
   ``tmp/<hex>.partial`` and the blob is renamed into ``blobs/`` only when its size and
   digest match; a partial left by a cut transfer or a restart is resumed from its length
   (the download asked with a ``Range``); wrong bytes remove the partial
   (``StoreSourceMismatch``);
4. ``finish``, under the store lock: every blob stored, a release bundle's signature
   files (``site.release_files``, fetched after the blobs and checked against ``files[]``,
   checked again here) written beside ``bundle.json`` as a stick's import keeps them, the
   record written (last: it makes the bundle count), then ``index.json``.

Blocking calls, except ``fill``: the caller runs them in a worker thread. ``fill`` runs
its blocking side on the store's own threads (two per blob in flight, ``fill_threads``),
never on asyncio's default executor: a fill holds its threads for as long as the blob
takes, and the default executor has min(32, CPUs + 4) workers that the peer server's reads
and every other short job share. Measured (bench/fanout, 8 nodes on 2 CPUs, 6 workers): with
4 fills in flight the serving reads queued behind them, and with 8 the uploads stalled past
the request timeout and the peers were dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from nodeagent.adapters.bundles.tree import load_trusted_keys_dir, verify_signed
from nodeagent.adapters.bundles.trust import kept_signatures
from nodeagent.adapters.files import STORE_FILE_MODE, write_atomic
from nodeagent.adapters.fips import FIPS_ENABLED_FILE
from nodeagent.adapters.store.accepted import accepted_stamps, record_accepted
from nodeagent.adapters.store.blobs import BlobStore, StoreLock
from nodeagent.adapters.store.copier import StoreLimits, admit_copy, plan_copy
from nodeagent.adapters.store.records import (
    StoreRecords,
    has_signature,
    read_bundle_file,
    record_for,
    write_signatures,
)
from nodeagent.adapters.store.registry_sets import ChunkPipe
from nodeagent.bundles.freshness import Stamp
from nodeagent.bundles.manifest import BundleManifest, parse_manifest
from nodeagent.errors import HostFileError, NodeAgentError, StoreBlobMissing
from nodeagent.site.fetching import SignedBundle
from nodeagent.site.release_files import checked_all
from nodeagent.store import layout

QUEUED_CHUNKS: Final = 2
"""Chunks (1 MiB each, ``adapters.http.client``) waiting for a blob's fill: up to
``fetch_concurrency`` blobs fill at once, so each holds little (8 chunks each, with 8 blobs
in flight, peaked the fetching daemons at 250-310 MiB in bench/fanout)."""

Download = Callable[[int, Callable[[bytes], Awaitable[None]]], Awaitable[int]]
"""Fetches a blob from the given offset to its end, handing each chunk to the writer; the
bytes received."""


def fetching_manifests(root: Path) -> dict[str, bytes]:
    """Bundle id → ``bundle.json`` of every bundle directory with its signed manifest and
    signature but no record yet (a fetch under way)."""
    found: dict[str, bytes] = {}
    try:
        names = sorted(p.name for p in (root / layout.BUNDLES_DIR).iterdir())
    except FileNotFoundError:
        return found
    except OSError as err:
        raise HostFileError(f"cannot list {root / layout.BUNDLES_DIR}: {err.strerror}") from err
    for name in names:
        directory = root / layout.bundle_dir(name) if layout.is_bundle_id(name) else None
        if directory is None or (directory / layout.RECORD_NAME).exists():
            continue
        if not has_signature(directory):
            continue
        data = read_bundle_file(root, name, layout.MANIFEST_NAME)
        if data is not None:
            found[name] = data
    return found


def fetching_sizes(root: Path) -> dict[str, dict[str, int]]:
    """Bundle id → (digest → size) of every blob of each bundle being fetched; a manifest
    that does not parse, or names another id, is left out."""
    sizes: dict[str, dict[str, int]] = {}
    for bundle_id, data in fetching_manifests(root).items():
        try:
            manifest = parse_manifest(data)
        except NodeAgentError:
            continue
        if manifest.bundle_id == bundle_id:
            sizes[bundle_id] = {d: f.size_bytes for d, f in manifest.blobs.items()}
    return sizes


def fetching_digests(root: Path) -> frozenset[str]:
    """Every blob a bundle being fetched lists: the keeper keeps them and their partials."""
    return frozenset(d for sizes in fetching_sizes(root).values() for d in sizes)


class FetchStore:
    """The store at ``root`` as the fetcher writes into it."""

    def __init__(
        self,
        root: Path,
        trusted_keys_dir: Path,
        limits: StoreLimits,
        *,
        fills: int = 4,
        fips_switch: Path = FIPS_ENABLED_FILE,
    ) -> None:
        self.root = root
        self.trusted_keys_dir = trusted_keys_dir
        self.fips_switch = fips_switch
        self.limits = limits
        self.blobs = BlobStore(root)
        self.records = StoreRecords(root)
        self._threads = ThreadPoolExecutor(max_workers=2 * fills, thread_name_prefix="fetch")
        """Each blob in flight: its fill (hashing and writing) and its download's writes into
        the pipe (blocking while the fill is behind). At most ``fills`` blobs at once."""

    def close(self) -> None:
        """The fill threads end once idle (a fill still running finishes first)."""
        self._threads.shutdown(wait=False)

    # ------------------------------------------------------------ what is held
    def verify(
        self, data: bytes, signature: bytes | None, ecdsa: bytes | None = None
    ) -> SignedBundle:
        """The peer's manifest and signature files, checked against this node's trusted keys
        (``trust.verify_signed``); only the files the rule looked at are kept (on a host in
        FIPS mode, minisign's is not)."""
        keys = load_trusted_keys_dir(self.trusted_keys_dir, fips_switch=self.fips_switch)
        verified = verify_signed(data, signature, ecdsa, keys)
        manifest = parse_manifest(data)
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        kept, kept_ecdsa = kept_signatures(verified, signature, ecdsa)
        return SignedBundle(
            manifest, digest, data, kept, verified.key_id_hex, verified.key_name or "",
            kept_ecdsa, verified.linked,
        )  # fmt: skip

    def held(self) -> dict[str, tuple[str, bool]]:
        """Bundle id → (digest of its stored ``bundle.json``, whether it has a record):
        recorded bundles and those being fetched."""
        found: dict[str, tuple[str, bool]] = {}
        try:
            names = sorted(p.name for p in (self.root / layout.BUNDLES_DIR).iterdir())
        except FileNotFoundError:
            return found
        except OSError as err:
            raise HostFileError(f"cannot list the store's bundles: {err.strerror}") from err
        for name in names:
            if not layout.is_bundle_id(name):
                continue
            directory = self.root / layout.bundle_dir(name)
            data = read_bundle_file(self.root, name, layout.MANIFEST_NAME)
            if data is not None:
                digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
                found[name] = (digest, (directory / layout.RECORD_NAME).exists())
        return found

    def accepted(self) -> tuple[Stamp, ...]:
        """Every signed manifest the store keeps, verified again (``adapters.store.accepted``)."""
        return accepted_stamps(self.root, self.trusted_keys_dir, fips_switch=self.fips_switch)

    def unfinished(self) -> list[SignedBundle]:
        """Bundles whose fetch did not finish (found at start), verified again: a manifest
        whose key is no longer trusted is left as it is and not resumed."""
        found = []
        for bundle_id, data in fetching_manifests(self.root).items():
            signature = read_bundle_file(self.root, bundle_id, layout.SIGNATURE_NAME)
            ecdsa = read_bundle_file(self.root, bundle_id, layout.ECDSA_SIGNATURE_NAME)
            try:
                signed = self.verify(data, signature, ecdsa)
            except NodeAgentError:
                continue
            if signed.manifest.bundle_id == bundle_id:
                found.append(signed)
        return found

    def stored_signed(self, bundle_id: str) -> SignedBundle | None:
        """A recorded bundle's ``bundle.json`` and signature, verified again (None when it
        is not recorded, or no longer verifies)."""
        if not layout.is_bundle_id(bundle_id):
            return None
        directory = self.root / layout.bundle_dir(bundle_id)
        if not (directory / layout.RECORD_NAME).is_file():
            return None
        data = read_bundle_file(self.root, bundle_id, layout.MANIFEST_NAME)
        signature = read_bundle_file(self.root, bundle_id, layout.SIGNATURE_NAME)
        ecdsa = read_bundle_file(self.root, bundle_id, layout.ECDSA_SIGNATURE_NAME)
        try:
            signed = self.verify(data or b"", signature, ecdsa)
        except NodeAgentError:
            return None
        return signed if signed.manifest.bundle_id == bundle_id else None

    def missing(self, manifest: BundleManifest) -> dict[str, int]:
        """Digest → size of the bundle's blobs not stored yet."""
        return {d: f.size_bytes for d, f in plan_copy(self.blobs, manifest).missing}

    def partial_bytes(self, digests: set[str]) -> int:
        return sum(size for d, (size, _) in self.blobs.partials().items() if d in digests)

    # ------------------------------------------------------------ writing
    def begin(self, signed: SignedBundle) -> int:
        """Admit the missing bytes, then write the signed manifest and its signature; the
        bytes still to fetch."""
        manifest = signed.manifest
        with StoreLock(self.root):
            self.blobs.ensure()
            self.records.ensure_layout()
            missing = sum(self.missing(manifest).values())
            admit_copy(self.blobs, f"bundle {manifest.bundle_id}", missing, self.limits)
            directory = self.records.bundle_path(manifest.bundle_id)
            write_atomic(directory / layout.MANIFEST_NAME, signed.data, mode=STORE_FILE_MODE)
            write_signatures(directory, signed.signature, signed.ecdsa_signature)
            record_accepted(
                self.root,
                manifest.stamp(signed.key_id_hex, signed.manifest_digest, signed.linked),
            )
        return missing

    async def fill(
        self,
        digest: str,
        size_bytes: int,
        download: Download,
        on_bytes: Callable[[int], None] = lambda _n: None,
    ) -> None:
        """Fetch one blob into the store through ``BlobStore.fill`` (see the module's 3.)."""
        loop = asyncio.get_running_loop()
        sources: asyncio.Queue[tuple[int, ChunkPipe]] = asyncio.Queue()
        pipes: list[ChunkPipe] = []

        stopped = threading.Event()

        def open_source(offset: int) -> ChunkPipe:
            pipe = ChunkPipe(QUEUED_CHUNKS)
            if stopped.is_set():  # the fetch was cancelled: end the fill, keep the partial
                pipe.end(asyncio.CancelledError())
            pipes.append(pipe)
            loop.call_soon_threadsafe(sources.put_nowait, (offset, pipe))
            return pipe

        def run() -> None:
            blobs = BlobStore(self.root)  # its own hashing thread: fills run side by side
            try:
                filled = blobs.fill(digest, size_bytes, open_source, on_bytes)
            finally:
                for pipe in pipes:  # a download still writing stops at once
                    pipe.close_reader()
                blobs.close()
            blobs.commit(filled)

        filling: asyncio.Future[None] = loop.run_in_executor(self._threads, run)
        try:
            while True:
                asking = asyncio.ensure_future(sources.get())
                either: set[asyncio.Future[Any]] = {filling, asking}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not asking.done():
                    asking.cancel()
                    await filling  # raises the store's error (a mismatch removed the partial)
                    return
                await _feed(asking.result(), size_bytes, download, filling, self._threads)
        except BaseException as err:
            stopped.set()
            for pipe in list(pipes):
                pipe.end(err)
            raise

    def finish(
        self, signed: SignedBundle, extra: Mapping[str, bytes] = MappingProxyType({})
    ) -> None:
        """Every blob stored: write the release signature files ``extra`` (checked again
        against the manifest: exactly its listed files, sizes and sha256), the record (last),
        then ``index.json``."""
        manifest = signed.manifest
        files = checked_all(manifest, extra)
        with StoreLock(self.root):
            missing = self.missing(manifest)
            if missing:
                raise StoreBlobMissing(
                    f"bundle {manifest.bundle_id}: {len(missing)} blobs are not stored yet"
                )
            record = record_for(
                manifest,
                signed.key_id_hex,
                signed.key_name,
                self.records.top_manifest_types(manifest),
                time.time(),
            )
            self.records.write_bundle(
                record, signed.data, signed.signature, files, ecdsa=signed.ecdsa_signature
            )
            self.records.refresh_index(self.records.load().records, set(self.blobs.stored()))


async def _feed(
    source: tuple[int, ChunkPipe],
    size_bytes: int,
    download: Download,
    filling: asyncio.Future[None],
    threads: ThreadPoolExecutor,
) -> None:
    """Download into one pipe ``BlobStore.fill`` reads; a failed download ends it with its
    error (the partial stays for a resume) and is raised, unless the store failed first. A
    partial already whole (cut off before its rename) needs no byte more."""
    offset, pipe = source
    if offset >= size_bytes:
        pipe.end()
        return

    loop = asyncio.get_running_loop()

    async def write(chunk: bytes) -> None:
        await loop.run_in_executor(threads, pipe.write, chunk)

    try:
        await download(offset, write)
    except BaseException as err:
        pipe.end(err)
        try:
            await asyncio.shield(filling)
        except NodeAgentError as stopped:
            raise stopped from err
        except Exception:  # noqa: BLE001, S110  (the pipe's own stop: the download's error)
            pass
        raise
    pipe.end()
