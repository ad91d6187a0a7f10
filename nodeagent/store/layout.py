"""Names inside the store, the record kept per accepted bundle, and the ``index.json`` they make.

The store is an OCI image layout (the OCI image-layout specification: ``oci-layout``,
``index.json``, ``blobs/<alg>/<hex>``) plus nodeagent's own files beside it, which tools
reading the layout ignore::

    oci-layout                          {"imageLayoutVersion": "1.0.0"}
    index.json                          every stored image's top manifest, named by reference
    blobs/sha256/<hex>                  every blob, once, complete and verified (or absent)
    bundles/<bundle-id>/bundle.json     the signed manifest, byte for byte
    bundles/<bundle-id>/bundle.json.minisig   the signatures: minisign's, ECDSA's, or both
    bundles/<bundle-id>/bundle.json.ecdsa-sig
    bundles/<bundle-id>/record.json     ``BundleRecord``: key, channel, sets, images, blobs
    sets/<set-name>/record.json         a registry set's record (``[store] registry_sets``):
                                        a ``BundleRecord`` with ``source`` "registry"
    gc-marks.json                       when each unreferenced blob was first found so
    rollback-marks.json                 anti-rollback marks (``bundles.rollback_marks``)
    tmp/<hex>.partial                   a blob being written (resumed after a crash)

Records are read strictly (``from_json``): a record nodeagent cannot have written raises
``StoreRecordDamaged`` naming the field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from nodeagent.errors import StoreRecordDamaged
from nodeagent.strict import MalformedInput, loads_json, quoted

OCI_LAYOUT_NAME: Final = "oci-layout"
OCI_LAYOUT_BYTES: Final = b'{"imageLayoutVersion":"1.0.0"}'
INDEX_NAME: Final = "index.json"
BLOBS_DIR: Final = "blobs/sha256"
BUNDLES_DIR: Final = "bundles"
SETS_DIR: Final = "sets"
TMP_DIR: Final = "tmp"
MARKS_NAME: Final = "gc-marks.json"
ROLLBACK_MARKS_NAME: Final = "rollback-marks.json"
"""The anti-rollback marks (``bundles.rollback_marks``), at the store's root beside
``bundles/`` (``adapters.store.accepted``)."""
RECORD_NAME: Final = "record.json"
MANIFEST_NAME: Final = "bundle.json"
SIGNATURE_NAME: Final = "bundle.json.minisig"
ECDSA_SIGNATURE_NAME: Final = "bundle.json.ecdsa-sig"
"""The ECDSA signature (decision 0075), kept beside or instead of the minisign one."""
SIGNATURE_NAMES: Final = (SIGNATURE_NAME, ECDSA_SIGNATURE_NAME)
PARTIAL_SUFFIX: Final = ".partial"
REF_NAME_ANNOTATION: Final = "org.opencontainers.image.ref.name"
INDEX_MEDIA_TYPE: Final = "application/vnd.oci.image.index.v1+json"
RECORD_VERSION: Final = 1
MAX_RECORD_BYTES: Final = 64 << 20
"""A record lists a bundle's images and blobs: 5,000 blobs take about 500 KB."""
MAX_SIZE_BYTES: Final = (1 << 63) - 1
MAX_SEQUENCE: Final = (1 << 53) - 1

_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_BUNDLE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_CHANNEL = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_KEY_ID = re.compile(r"^[A-F0-9]{1,16}$")
_SET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A PinnedImageSet's name: a DNS subdomain (``specs``), at most 253 characters."""
_MEDIA_PART = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_MEDIA_TYPE = re.compile(rf"^{_MEDIA_PART}/{_MEDIA_PART}$")


def is_digest(text: object) -> bool:
    return isinstance(text, str) and _DIGEST.match(text) is not None


def is_bundle_id(text: object) -> bool:
    return isinstance(text, str) and _BUNDLE_ID.match(text) is not None and text not in (".", "..")


def is_set_name(text: object) -> bool:
    return isinstance(text, str) and len(text) <= 253 and _SET_NAME.fullmatch(text) is not None


def blob_path(digest: str) -> str:
    """``blobs/sha256/<hex>``: where a blob lives, relative to the store (digest checked)."""
    if not is_digest(digest):
        raise ValueError(f"{quoted(digest, 100)} is not a sha256 digest")
    return f"{BLOBS_DIR}/{digest.removeprefix('sha256:')}"


def partial_path(digest: str) -> str:
    """``tmp/<hex>.partial``: a blob being written, keyed by its digest so a copy resumes."""
    return f"{TMP_DIR}/{blob_path(digest).rsplit('/', 1)[1]}{PARTIAL_SUFFIX}"


def digest_of_name(name: str) -> str | None:
    """The digest a file name in ``blobs/sha256`` (or a partial's) stands for; None: not one."""
    candidate = "sha256:" + name.removesuffix(PARTIAL_SUFFIX)
    return candidate if is_digest(candidate) else None


def bundle_dir(bundle_id: str) -> str:
    """``bundles/<bundle-id>``, for a bundle id of the format's form only."""
    if not is_bundle_id(bundle_id):
        raise ValueError(f"{quoted(bundle_id, 100)} is not a bundle id")
    return f"{BUNDLES_DIR}/{bundle_id}"


def set_dir(set_name: str) -> str:
    """``sets/<set-name>``: a registry set's record (a DNS subdomain only: no ``/`` or ``..``)."""
    if not is_set_name(set_name):
        raise ValueError(f"{quoted(set_name, 100)} is not a set name")
    return f"{SETS_DIR}/{set_name}"


# ---------------------------------------------------------------- records
RecordSource = Literal["bundle", "registry"]


@dataclass(frozen=True, slots=True)
class BlobRef:
    digest: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class StoredImage:
    """An image of a bundle: its reference, and the top manifest ``index.json`` names."""

    name: str
    digest: str
    size_bytes: int
    """The top manifest's own size (what the index descriptor says), not the image's."""
    media_type: str


@dataclass(frozen=True, slots=True)
class BundleRecord:
    """What the store remembers of an accepted bundle (``bundles/<id>/record.json``), or of a
    set whose blobs were fetched from its registry (``sets/<name>/record.json``, ``source``
    "registry": ``bundle_id`` is then the set's name, the only set; no key, no channel, no
    signed manifest beside it)."""

    bundle_id: str
    key_id: str
    """The signing key's id as minisign prints it (upper-case hex, at most 16 digits)."""
    key_name: str
    channel: str
    created: str
    accepted_at_s: float
    """Unix time the copy into the store completed."""
    sets: tuple[str, ...]
    images: tuple[StoredImage, ...]
    blobs: tuple[BlobRef, ...]
    source: RecordSource = "bundle"
    sequence: int | None = None
    """The bundle's signed sequence (docs/bundle-format.md#anti-rollback); None in a record
    written before sequences were recorded (``keeping`` then orders by ``created``)."""

    @property
    def is_registry(self) -> bool:
        return self.source == "registry"

    @property
    def size_bytes(self) -> int:
        return sum(blob.size_bytes for blob in self.blobs)

    @property
    def digests(self) -> frozenset[str]:
        return frozenset(blob.digest for blob in self.blobs)

    def to_json(self) -> dict[str, Any]:
        head: dict[str, Any] = (
            {"source": "registry", "setName": self.bundle_id}
            if self.is_registry
            else {
                "bundleId": self.bundle_id,
                "keyId": self.key_id,
                "keyName": self.key_name,
                "channel": self.channel,
            }
            | ({} if self.sequence is None else {"sequence": self.sequence})
        )
        return {
            "recordVersion": RECORD_VERSION,
            **head,
            "created": self.created,
            "acceptedAt": self.accepted_at_s,
            "sets": list(self.sets),
            "images": [
                {
                    "name": i.name,
                    "digest": i.digest,
                    "sizeBytes": i.size_bytes,
                    "mediaType": i.media_type,
                }
                for i in self.images
            ],
            "blobs": [{"digest": b.digest, "sizeBytes": b.size_bytes} for b in self.blobs],
        }

    @classmethod
    def from_json(cls, doc: object, where: str) -> BundleRecord:
        if not isinstance(doc, dict) or doc.get("recordVersion") != RECORD_VERSION:
            raise StoreRecordDamaged(f"{where} is not a version {RECORD_VERSION} record")
        if doc.get("source", "bundle") == "registry":
            return _registry_record(doc, where)
        if doc.get("source", "bundle") != "bundle":
            raise StoreRecordDamaged(f"{where}: source must be bundle or registry")
        bundle_id = _text(doc, "bundleId", where)
        if not is_bundle_id(bundle_id):
            raise StoreRecordDamaged(f"{where}: bundleId {quoted(bundle_id, 100)} is not one")
        accepted = doc.get("acceptedAt")
        if not _is_time(accepted):
            raise StoreRecordDamaged(f"{where}: acceptedAt must be a time in seconds")
        return cls(
            bundle_id=bundle_id,
            key_id=_matching(doc, "keyId", _KEY_ID, where),
            key_name=_text(doc, "keyName", where),
            channel=_matching(doc, "channel", _CHANNEL, where),
            created=_text(doc, "created", where),
            accepted_at_s=float(accepted or 0),
            sets=tuple(_text({"s": s}, "s", f"{where} sets") for s in _list(doc, "sets", where)),
            images=tuple(_image(item, f"{where} images") for item in _list(doc, "images", where)),
            blobs=tuple(_blob(item, f"{where} blobs") for item in _list(doc, "blobs", where)),
            sequence=_sequence(doc, where),
        )


def _sequence(doc: Mapping[str, Any], where: str) -> int | None:
    value = doc.get("sequence")
    if value is not None and (type(value) is not int or not 0 <= value <= MAX_SEQUENCE):
        raise StoreRecordDamaged(f"{where}: sequence must be an integer 0 to {MAX_SEQUENCE}")
    return value


def registry_record(
    set_name: str,
    images: Iterable[StoredImage],
    blobs: Iterable[BlobRef],
    created: str,
    accepted_at_s: float,
) -> BundleRecord:
    """The record of a set whose images' blobs were fetched from their registry."""
    if not is_set_name(set_name):
        raise ValueError(f"{quoted(set_name, 100)} is not a set name")
    unique = {blob.digest: blob for blob in blobs}
    return BundleRecord(
        bundle_id=set_name,
        key_id="",
        key_name="",
        channel="",
        created=created,
        accepted_at_s=accepted_at_s,
        sets=(set_name,),
        images=tuple(sorted({i.name: i for i in images}.values(), key=lambda i: i.name)),
        blobs=tuple(sorted(unique.values(), key=lambda b: b.digest)),
        source="registry",
    )


def _registry_record(doc: Mapping[str, Any], where: str) -> BundleRecord:
    set_name = _text(doc, "setName", where)
    if not is_set_name(set_name):
        raise StoreRecordDamaged(f"{where}: setName {quoted(set_name, 100)} is not one")
    accepted = doc.get("acceptedAt")
    if not _is_time(accepted):
        raise StoreRecordDamaged(f"{where}: acceptedAt must be a time in seconds")
    sets = tuple(_text({"s": s}, "s", f"{where} sets") for s in _list(doc, "sets", where))
    if sets != (set_name,):
        raise StoreRecordDamaged(f"{where}: sets must be [{set_name!r}] alone")
    return registry_record(
        set_name,
        (_image(item, f"{where} images") for item in _list(doc, "images", where)),
        (_blob(item, f"{where} blobs") for item in _list(doc, "blobs", where)),
        _text(doc, "created", where),
        float(accepted or 0),
    )


def _is_time(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0  # type: ignore[arg-type,operator]


def _list(doc: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise StoreRecordDamaged(f"{where}: {key} must be a list")
    return value


def _text(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or len(value) > 1024:
        raise StoreRecordDamaged(f"{where}: {key} must be a string of at most 1024 characters")
    return value


def _matching(doc: Mapping[str, Any], key: str, pattern: re.Pattern[str], where: str) -> str:
    value = _text(doc, key, where)
    if not pattern.match(value):
        raise StoreRecordDamaged(f"{where}: {key} {quoted(value, 100)} is not of its form")
    return value


def _size(doc: Mapping[str, Any], where: str) -> int:
    size = doc.get("sizeBytes")
    if type(size) is not int or not 0 <= size <= MAX_SIZE_BYTES:
        raise StoreRecordDamaged(f"{where}: sizeBytes must be 0 to {MAX_SIZE_BYTES}")
    return size


def _digest(doc: Mapping[str, Any], where: str) -> str:
    digest = doc.get("digest")
    if not is_digest(digest):
        raise StoreRecordDamaged(f"{where}: {quoted(digest, 100)} is not a sha256 digest")
    return str(digest)


def _blob(item: object, where: str) -> BlobRef:
    if not isinstance(item, dict):
        raise StoreRecordDamaged(f"{where}: an entry is not an object")
    return BlobRef(_digest(item, where), _size(item, where))


def _image(item: object, where: str) -> StoredImage:
    if not isinstance(item, dict):
        raise StoreRecordDamaged(f"{where}: an entry is not an object")
    media_type = _matching(item, "mediaType", _MEDIA_TYPE, where)
    return StoredImage(
        _text(item, "name", where), _digest(item, where), _size(item, where), media_type
    )


def is_media_type(text: object) -> bool:
    return isinstance(text, str) and _MEDIA_TYPE.match(text) is not None


# ---------------------------------------------------------------- index.json
def render_index(images: Iterable[StoredImage]) -> bytes:
    """``index.json`` naming each image's top manifest by its reference, sorted, each name once.

    ``skopeo copy oci:<store>:<reference>`` finds an image by that annotation.
    """
    by_name = {image.name: image for image in images}
    manifests = [
        {
            "mediaType": image.media_type,
            "digest": image.digest,
            "size": image.size_bytes,
            "annotations": {REF_NAME_ANNOTATION: image.name},
        }
        for _, image in sorted(by_name.items())
    ]
    doc = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": manifests}
    return (json.dumps(doc, indent=1) + "\n").encode()


MAX_INDEX_BYTES: Final = 16 << 20
"""A larger ``index.json`` is refused (each image takes about 300 bytes)."""


def index_names(data: bytes) -> tuple[str, ...]:
    """The image names ``index.json`` lists (``render_index``'s annotations): what the store
    holds and serves; ``StoreRecordDamaged`` when it is not such a file."""
    try:
        doc = loads_json(data, what=INDEX_NAME, max_bytes=MAX_INDEX_BYTES, max_depth=8)
    except MalformedInput as err:
        raise StoreRecordDamaged(str(err)) from None
    manifests = doc.get("manifests") if isinstance(doc, dict) else None
    if not isinstance(manifests, list):
        raise StoreRecordDamaged(f"{INDEX_NAME} holds no 'manifests' list")
    names = []
    for item in manifests:
        annotations = item.get("annotations") if isinstance(item, dict) else None
        name = annotations.get(REF_NAME_ANNOTATION) if isinstance(annotations, dict) else None
        if not isinstance(name, str):
            raise StoreRecordDamaged(f"{INDEX_NAME}: an entry has no {REF_NAME_ANNOTATION}")
        names.append(name)
    return tuple(names)


# ---------------------------------------------------------------- removal marks
def marks_from_json(doc: object) -> dict[str, float]:
    """``gc-marks.json``: digest → Unix time it was first found unreferenced."""
    marks = doc.get("marks") if isinstance(doc, dict) else None
    if not isinstance(marks, dict):
        raise StoreRecordDamaged(f"{MARKS_NAME} holds no 'marks' object")
    for digest, when in marks.items():
        if not is_digest(digest) or not _is_time(when):
            raise StoreRecordDamaged(f"{MARKS_NAME}: {quoted(digest, 100)} has no valid time")
    return {str(digest): float(when) for digest, when in marks.items()}


def marks_to_json(marks: Mapping[str, float]) -> dict[str, Any]:
    return {"marks": dict(sorted(marks.items()))}
