"""The store's own files: the layout files, each bundle's signed manifest and record, the marks.

Every file is written atomically (``adapters.files.write_atomic``). A bundle's
``bundle.json`` and signature are written before its ``record.json``: a directory
without a record is a copy that did not finish and refers to nothing. A record or the
marks file that cannot be read is set aside (``<name>.damaged-<time>``) and rebuilt: a
record from the bundle's own ``bundle.json`` and signature, the marks as empty (every
unreferenced blob then waits a whole grace period again: nothing is removed early).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final

import structlog

from nodeagent.adapters.bundles.tree import BundleDir
from nodeagent.adapters.files import STORE_DIR_MODE, STORE_FILE_MODE, set_aside, write_atomic
from nodeagent.adapters.store.release_files import ReleaseSignatureFiles
from nodeagent.bundles import ecdsa_signature, minisign
from nodeagent.bundles.manifest import (
    MAX_MANIFEST_BYTES,
    BundleError,
    BundleManifest,
    parse_manifest,
)
from nodeagent.bundles.mirror import manifest_media_type
from nodeagent.errors import HostFileError, NodeAgentError, StoreRecordDamaged
from nodeagent.registries import MEDIA_TYPE_OCI_MANIFEST
from nodeagent.store import layout
from nodeagent.store.layout import BlobRef, BundleRecord, StoredImage
from nodeagent.strict import MalformedInput, clip, loads_json, quoted

log = structlog.get_logger(__name__)

MAX_MANIFEST_READ_BYTES = 4 << 20
"""A top manifest read for its media type (distribution's manifest limit)."""


@dataclass(frozen=True)
class LoadedRecords:
    records: tuple[BundleRecord, ...]
    repairs: tuple[str, ...] = field(default=())
    """One line per record set aside and rebuilt (or dropped), for the journal and the CLI."""


def _read_bounded(path: Path, max_bytes: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise HostFileError(f"cannot open {path}: {err.strerror}") from err
    with os.fdopen(fd, "rb") as stream:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StoreRecordDamaged(f"{path} is larger than {max_bytes} bytes")
    return data


_BUNDLE_FILE_LIMITS: Final = {
    layout.MANIFEST_NAME: MAX_MANIFEST_BYTES,
    layout.SIGNATURE_NAME: minisign.MAX_SIGNATURE_BYTES,
    layout.ECDSA_SIGNATURE_NAME: ecdsa_signature.MAX_SIGNATURE_BYTES,
}
"""The files kept beside a bundle's record that a peer may ask for, and their bounds."""


def write_signatures(directory: Path, minisig: bytes | None, ecdsa: bytes | None) -> None:
    """A bundle's signature files as verified: each one given written, each one not given
    removed (a signature nobody verified is never kept)."""
    for name, data in ((layout.SIGNATURE_NAME, minisig), (layout.ECDSA_SIGNATURE_NAME, ecdsa)):
        if data is None:
            (directory / name).unlink(missing_ok=True)
        else:
            write_atomic(directory / name, data, mode=STORE_FILE_MODE)


def has_signature(directory: Path) -> bool:
    """Whether a bundle's directory holds a signature file (either scheme's)."""
    return any((directory / name).is_file() for name in layout.SIGNATURE_NAMES)


def _signing_key_id(minisig: bytes | None, ecdsa: bytes | None) -> str:
    """The key id a record names, read from the signature (a damaged record's rebuild; the
    signature is verified wherever the bundle is used)."""
    if minisig is not None:
        return minisign.key_id_hex(minisign.parse_signature(minisig).key_id)
    return minisign.key_id_hex(ecdsa_signature.parse_signature(ecdsa).key_id)


def read_bundle_file(root: Path, bundle_id: str, name: str) -> bytes | None:
    """``bundle.json`` or its signature, read beneath the store without following links;
    None when absent or not a valid bundle id."""
    if not layout.is_bundle_id(bundle_id) or name not in _BUNDLE_FILE_LIMITS:
        return None
    limit = _BUNDLE_FILE_LIMITS[name]
    with BundleDir(root) as store:
        try:
            data = store.read_small(f"{layout.bundle_dir(bundle_id)}/{name}", limit)
        except BundleError:
            return None  # a link or another unsafe entry: never served
    return data if data is not None and len(data) <= limit else None


def read_release_signature(root: Path, bundle_id: str, path: str) -> bytes | None:
    """A release signature file of a stored bundle (``release-signatures/sha256-<hex>-<n>``),
    only when the bundle's stored (verified) manifest lists ``path``: the file is then read by
    the manifest's own path and entry, never by ``path``, and checked against its size and
    sha256. None when not listed, absent, damaged or a link. A server keeps one
    ``ReleaseSignatureFiles``, which parses each ``bundle.json`` once per version."""
    return ReleaseSignatureFiles(root).read(bundle_id, path)


def _json(path: Path, max_bytes: int) -> object | None:
    data = _read_bounded(path, max_bytes)
    if data is None:
        return None
    try:
        doc: object = loads_json(data, what=str(path), max_bytes=max_bytes, max_depth=8)
    except MalformedInput as err:
        raise StoreRecordDamaged(clip(str(err), 400)) from None
    return doc


class StoreRecords:
    """The files of the store rooted at ``root`` other than blobs."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ensure_layout(self) -> None:
        """``oci-layout``, and an empty ``index.json`` when there is none yet."""
        oci_layout = self.root / layout.OCI_LAYOUT_NAME
        write_atomic(oci_layout, layout.OCI_LAYOUT_BYTES, mode=STORE_FILE_MODE)
        if not (self.root / layout.INDEX_NAME).exists():
            self.write_index(())

    def write_index(self, images: Iterable[StoredImage]) -> bool:
        data = layout.render_index(images)
        return write_atomic(self.root / layout.INDEX_NAME, data, mode=STORE_FILE_MODE)

    def refresh_index(self, records: Iterable[BundleRecord], stored: Set[str]) -> bool:
        """``index.json`` naming the images of every record whose top manifest is stored."""
        images = [i for r in records for i in r.images if i.digest in stored]
        return self.write_index(images)

    # ------------------------------------------------------------ bundles
    def bundle_path(self, bundle_id: str) -> Path:
        return self.root / layout.bundle_dir(bundle_id)

    def write_bundle(
        self,
        record: BundleRecord,
        manifest: bytes,
        signature: bytes | None,
        extra: Mapping[str, bytes] = MappingProxyType({}),
        *,
        ecdsa: bytes | None = None,
    ) -> None:
        """The signed manifest and its signatures (minisign's, ECDSA's: those verified; one
        not given is removed), then the record (last: it makes it count).

        ``extra``: small files the manifest lists and that were checked against it (a
        release's signatures, ``release-signatures/<name>``), kept beside it by their paths.
        """
        directory = self.bundle_path(record.bundle_id)
        for path, data in extra.items():
            (directory / path).parent.mkdir(mode=STORE_DIR_MODE, parents=True, exist_ok=True)
            write_atomic(directory / path, data, mode=STORE_FILE_MODE)
        write_atomic(directory / layout.MANIFEST_NAME, manifest, mode=STORE_FILE_MODE)
        write_signatures(directory, signature, ecdsa)
        text = canonical_json(record.to_json())
        write_atomic(directory / layout.RECORD_NAME, text, mode=STORE_FILE_MODE)

    def load(self, *, is_repairing: bool = True) -> LoadedRecords:
        """Every bundle's record, by bundle id; damaged ones set aside and rebuilt (without
        ``is_repairing``, for a reader without the store lock: rebuilt in memory only)."""
        records: list[BundleRecord] = []
        repairs: list[str] = []
        for bundle_id in self._names(layout.BUNDLES_DIR, layout.is_bundle_id):
            try:
                record = self._load_one(bundle_id)
            except StoreRecordDamaged as err:
                record = self._rebuild(bundle_id, err, repairs, is_repairing=is_repairing)
            if record is not None:
                records.append(record)
        for set_name in self._names(layout.SETS_DIR, layout.is_set_name):
            try:
                record = self._load_set(set_name)
            except StoreRecordDamaged as err:
                self._drop_set(set_name, err, repairs, is_repairing=is_repairing)
                continue
            if record is not None:
                records.append(record)
        return LoadedRecords(tuple(records), tuple(repairs))

    def _names(self, under: str, is_name: Callable[[object], bool]) -> list[str]:
        directory = self.root / under
        try:
            names = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
        except FileNotFoundError:
            return []
        except OSError as err:
            raise HostFileError(f"cannot list {directory}: {err.strerror}") from err
        return [name for name in names if is_name(name)]

    # ------------------------------------------------------------ registry sets
    def set_path(self, set_name: str) -> Path:
        return self.root / layout.set_dir(set_name)

    def write_set(self, record: BundleRecord) -> None:
        """A registry set's record, written once its blobs are all stored."""
        write_atomic(
            self.set_path(record.bundle_id) / layout.RECORD_NAME,
            canonical_json(record.to_json()),
            mode=STORE_FILE_MODE,
        )

    def remove_set(self, set_name: str) -> None:
        """Forget a released registry set (its blobs are then unreferenced)."""
        directory = self.set_path(set_name)
        try:
            for entry in directory.iterdir():
                entry.unlink()
            directory.rmdir()
        except FileNotFoundError:
            return
        except OSError as err:
            raise HostFileError(f"cannot remove {directory}: {err.strerror}") from err

    def _load_set(self, set_name: str) -> BundleRecord | None:
        path = self.set_path(set_name) / layout.RECORD_NAME
        doc = _json(path, layout.MAX_RECORD_BYTES)
        if doc is None:
            return None
        record = BundleRecord.from_json(doc, str(path))
        if not record.is_registry or record.bundle_id != set_name:
            raise StoreRecordDamaged(f"{path} is not the registry record of set {set_name}")
        return record

    def _drop_set(
        self, set_name: str, error: StoreRecordDamaged, repairs: list[str], *, is_repairing: bool
    ) -> None:
        """A damaged registry record has nothing signed to be rebuilt from: set aside, its
        blobs are fetched again from the registry when the set needs them."""
        if is_repairing:
            moved = set_aside(self.set_path(set_name) / layout.RECORD_NAME)
            log.warning(
                "store_record_damaged",
                set=set_name,
                reason=error.reason,
                error=error.message,
                moved_to=str(moved),
            )
        repairs.append(f"set {set_name}: record damaged, set aside (fetched again when needed)")

    def _load_one(self, bundle_id: str) -> BundleRecord | None:
        path = self.bundle_path(bundle_id) / layout.RECORD_NAME
        doc = _json(path, layout.MAX_RECORD_BYTES)
        if doc is None:
            return None  # a copy that did not finish: it refers to nothing
        record = BundleRecord.from_json(doc, str(path))
        if record.bundle_id != bundle_id:
            raise StoreRecordDamaged(f"{path} names bundle {quoted(record.bundle_id, 100)}")
        return record

    def _rebuild(
        self, bundle_id: str, error: StoreRecordDamaged, repairs: list[str], *, is_repairing: bool
    ) -> BundleRecord | None:
        directory = self.bundle_path(bundle_id)
        if is_repairing:
            moved = set_aside(directory / layout.RECORD_NAME)
            log.warning(
                "store_record_damaged",
                bundle=bundle_id,
                reason=error.reason,
                error=error.message,
                moved_to=str(moved),
            )
        try:
            manifest_bytes = _read_bounded(directory / layout.MANIFEST_NAME, 16 << 20)
            signature = _read_bounded(directory / layout.SIGNATURE_NAME, 16 << 10)
            ecdsa = _read_bounded(directory / layout.ECDSA_SIGNATURE_NAME, 1 << 10)
            if manifest_bytes is None or (signature is None and ecdsa is None):
                raise StoreRecordDamaged(f"{directory} lacks its bundle.json or signature")
            key_id = _signing_key_id(signature, ecdsa)
            manifest = parse_manifest(manifest_bytes)
        except NodeAgentError as err:  # BundleError, a malformed signature
            repairs.append(f"{bundle_id}: record damaged and not rebuilt ({err.reason})")
            return None
        record = record_for(manifest, key_id, "", self.top_manifest_types(manifest), 0.0)
        if not is_repairing:
            repairs.append(f"{bundle_id}: record damaged, read from its bundle.json for now")
            return record
        self.write_bundle(record, manifest_bytes, signature, ecdsa=ecdsa)
        repairs.append(f"{bundle_id}: record damaged, rebuilt from its bundle.json")
        return record

    def top_manifest_types(self, manifest: BundleManifest) -> dict[str, str]:
        """Digest → media type of each image's top manifest, read from the stored blob."""
        types = {}
        for image in manifest.images:
            path = self.root / layout.blob_path(image.manifest_digest)
            try:
                body = _read_bounded(path, MAX_MANIFEST_READ_BYTES)
            except StoreRecordDamaged:
                body = None
            found = manifest_media_type(body) if body is not None else None
            types[image.manifest_digest] = found or MEDIA_TYPE_OCI_MANIFEST
        return types

    # ------------------------------------------------------------ removal marks
    def load_marks(self, *, is_repairing: bool = True) -> dict[str, float]:
        path = self.root / layout.MARKS_NAME
        try:
            doc = _json(path, layout.MAX_RECORD_BYTES)
            return {} if doc is None else layout.marks_from_json(doc)
        except StoreRecordDamaged as err:
            if not is_repairing:
                return {}
            moved = set_aside(path)
            log.warning(
                "store_record_damaged",
                file=str(path),
                reason=err.reason,
                error=err.message,
                moved_to=str(moved),
            )
            return {}

    def save_marks(self, marks: dict[str, float]) -> None:
        marks_json = canonical_json(layout.marks_to_json(marks))
        write_atomic(self.root / layout.MARKS_NAME, marks_json, mode=STORE_FILE_MODE)


def canonical_json(doc: object) -> bytes:
    """Canonical JSON (sorted keys, no NaN) of a record nodeagent wrote, as bytes."""
    return (json.dumps(doc, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


def record_for(
    manifest: BundleManifest,
    key_id_hex: str,
    key_name: str,
    media_types: dict[str, str],
    accepted_at_s: float,
) -> BundleRecord:
    """The record of a bundle whose blobs are all stored."""
    images = tuple(
        StoredImage(
            str(image.ref),
            image.manifest_digest,
            manifest.blobs[image.manifest_digest].size_bytes,
            media_types.get(image.manifest_digest, MEDIA_TYPE_OCI_MANIFEST),
        )
        for image in manifest.images
    )
    blobs = tuple(BlobRef(digest, file.size_bytes) for digest, file in manifest.blobs.items())
    return BundleRecord(
        bundle_id=manifest.bundle_id,
        key_id=key_id_hex,
        key_name=clip(key_name, 200),
        channel=manifest.channel,
        created=manifest.created,
        accepted_at_s=accepted_at_s,
        sets=tuple(s.name for s in manifest.sets),
        images=images,
        blobs=blobs,
        sequence=manifest.sequence,
    )
